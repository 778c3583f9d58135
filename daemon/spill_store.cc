#include "daemon/spill_store.h"

#include <filesystem>

#include <fmt/format.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>

#include "format/shm_file.h"
#include "format/spill_format.h"

namespace shmcache {

namespace {

Status FromRocks(const rocksdb::Status& s, const std::string& where) {
  if (s.ok()) return Status::OK();
  if (s.IsNoSpace() || s.subcode() == rocksdb::Status::kNoSpace) {
    return Status::Full("spill disk full in " + where + ": " + s.ToString());
  }
  if (s.IsNotFound()) return Status::NotFound(s.ToString());
  return Status::IOError("spill store " + where + ": " + s.ToString());
}

}  // namespace

SpillStore::~SpillStore() = default;

Status SpillStore::Open(const std::string& path, std::unique_ptr<SpillStore>* out,
                        bool create) {
  rocksdb::Options opts = SpillDbOptions();
  opts.create_if_missing = create;
  opts.IncreaseParallelism(2);
  // Small memtables: flushes need little free disk, and a nearly full disk
  // is noticed before a flush fails.
  opts.write_buffer_size = kWriteBufferBytes;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(opts, path, &db);
  if (!s.ok()) return FromRocks(s, path);
  std::unique_ptr<SpillStore> store(new SpillStore());
  store->db_.reset(db);
  store->path_ = path;
  *out = std::move(store);
  return Status::OK();
}

Status SpillStore::Put(uint32_t cache_id, uint64_t row_id,
                       std::span<const std::byte> row) {
  rocksdb::WriteBatch batch;
  SpillKey k(cache_id, row_id);
  batch.Put(k.slice(),
            rocksdb::Slice(reinterpret_cast<const char*>(row.data()), row.size()));
  return Write(&batch, row.size());
}

Status SpillStore::Write(rocksdb::WriteBatch* batch, uint64_t bytes) {
  if (failed_.load()) {
    MutexLock lock(&error_mu_);
    return Status::Full("spilling is off after an earlier error: " + error_);
  }
  // Room for the rows in the WAL and for flushing a full memtable.
  uint64_t need = bytes + 2 * kWriteBufferBytes;
  uint64_t free_bytes = FreeBytes(path_);
  if (free_bytes < need) {
    return Status::Full(
        fmt::format("spill disk full: {} MB free in {}, {} MB needed to go on spilling",
                    free_bytes >> 20, path_, (need + (1 << 20) - 1) >> 20));
  }
  Status s = FromRocks(db_->Write(rocksdb::WriteOptions(), batch), path_);
  if (!s.ok()) {
    MutexLock lock(&error_mu_);
    error_ = s.message();
    failed_.store(true);
  }
  return s;
}

Status SpillStore::MultiGet(uint32_t cache_id, std::span<const uint64_t> ids,
                            std::vector<std::string>* values, std::vector<bool>* found) {
  std::vector<SpillKey> keys;
  keys.reserve(ids.size());
  std::vector<rocksdb::Slice> slices;
  slices.reserve(ids.size());
  for (uint64_t id : ids) {
    keys.emplace_back(cache_id, id);
    slices.push_back(keys.back().slice());
  }
  values->assign(ids.size(), {});
  found->assign(ids.size(), false);
  std::vector<rocksdb::Status> st = db_->MultiGet(rocksdb::ReadOptions(), slices, values);
  for (size_t i = 0; i < st.size(); ++i) {
    if (st[i].ok()) {
      (*found)[i] = true;
    } else if (!st[i].IsNotFound()) {
      return FromRocks(st[i], path_);
    }
  }
  return Status::OK();
}

Status SpillStore::DropCache(uint32_t cache_id) {
  SpillKey begin(cache_id, 0);
  SpillKey end(cache_id + 1, 0);  // cache ids never reach 2^32 - 1
  rocksdb::Slice b = begin.slice(), e = end.slice();
  rocksdb::Status s =
      db_->DeleteRange(rocksdb::WriteOptions(), db_->DefaultColumnFamily(), b, e);
  if (!s.ok()) return FromRocks(s, path_);
  rocksdb::CompactRangeOptions co;
  co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  db_->Flush(rocksdb::FlushOptions());
  return FromRocks(db_->CompactRange(co, &b, &e), path_);
}

std::vector<uint32_t> SpillStore::CacheIds() {
  std::vector<uint32_t> ids;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid();) {
    rocksdb::Slice k = it->key();
    if (k.size() != 12) {
      it->Next();
      continue;
    }
    uint32_t id = 0;
    for (int i = 0; i < 4; ++i) id = id << 8 | static_cast<uint8_t>(k[i]);
    ids.push_back(id);
    if (id == UINT32_MAX) break;
    SpillKey next(id + 1, 0);
    it->Seek(next.slice());
  }
  return ids;
}

Status SpillStore::DestroyAll() {
  if (db_) {
    db_->Close();
    db_.reset();
  }
  rocksdb::Status s = rocksdb::DestroyDB(path_, rocksdb::Options());
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) return Status::IOError("cannot remove " + path_ + ": " + ec.message());
  return FromRocks(s, path_);
}

}  // namespace shmcache
