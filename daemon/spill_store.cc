#include "daemon/spill_store.h"

#include <malloc.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>

#include "format/owned_dir.h"
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

// Keeps the memory of flushed memtables in this process's heap for the
// next ones, instead of handing it back to the kernel and faulting it in
// again, page by page and zeroed, as the next memtable fills. glibc's
// defaults (a trim threshold that follows the largest block freed, a few
// MB) returned most of each flushed 16 MB memtable: in a spilling PutBatch
// of 3 KB rows the daemon took 0.6 page faults per row, about one per 4 KB
// of row bytes, 10% of its CPU (perf record, docs/spill-reads.md). Setting
// the trim threshold fixes the mmap threshold too (glibc stops adapting
// both), so it is raised with it: memtable arena blocks (an eighth of a
// memtable) and a request's write batch (up to 1 MB of rows) come from the
// heap. What stays held is at most the memtables' bytes plus the one being
// flushed, and FlushWhenIdle hands it back once writes stop.
void KeepMemtableMemory(const SpillStore::Memtables& m) {
  // glibc refuses thresholds above half its 64 MB heaps.
  constexpr uint64_t kMostMmapThreshold = 32u << 20;
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMostMmapThreshold));
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(m.total() + m.bytes));
}

}  // namespace

SpillStore::~SpillStore() {
  StopFlusher();
  db_.reset();
  if (dir_fd_ >= 0) close(dir_fd_);
}

void SpillStore::StopFlusher() {
  {
    MutexLock lock(&flush_mu_);
    closing_ = true;
    flush_cv_.SignalAll();
  }
  if (flusher_.joinable()) flusher_.join();
}

void SpillStore::FlushWhenIdle() {
  const auto idle = std::chrono::milliseconds(kIdleFlushMs);
  MutexLock lock(&flush_mu_);
  while (!closing_) {
    if (!unflushed_) {
      flush_cv_.Wait(&flush_mu_);
      continue;
    }
    const auto due = last_write_ + idle;
    if (std::chrono::steady_clock::now() < due) {
      flush_cv_.WaitUntil(&flush_mu_, due);
      continue;
    }
    unflushed_ = false;
    MutexUnlock unlocked(&flush_mu_);  // taken again at the end of this pass
    // Not after a failed write (RocksDB must see nothing more then), nor
    // without the room a flush needs: the next write reports why.
    uint64_t free_bytes = 0;
    if (!failed_.load() && CheckDirectory(&free_bytes).ok() &&
        free_bytes >= memtables_.total()) {
      rocksdb::FlushOptions fo;
      fo.allow_write_stall = true;
      if (db_->Flush(fo).ok()) WriteFlushMarker();
    }
    // The flushed memtables' memory, kept for the next ones while writes
    // came (KeepMemtableMemory), back to the kernel now that none come.
    malloc_trim(0);
  }
}

void SpillStore::WriteFlushMarker() {
  // A secondary instance seals the memtable it replayed from a log, and
  // drops it once the rows are in a table file, only when it replays a
  // write from a newer log (RocksDB 7.8, DBImplSecondary::RecoverLogFiles);
  // the flush leaves the new log empty. The marker is that write: one key
  // of another length than a row's, which no reader asks for and CacheIds
  // skips, right after the last row written. Not at the end of the key
  // space, as it was: every table file flushed with it then spanned to
  // there, overlapped the next ones, and a fill in id order, whose files
  // RocksDB would move down the levels as they are, had each rewritten by
  // a compaction instead (half the daemon's CPU in a spilling PutBatch of
  // 3 KB rows; docs/spill-reads.md). A dropped cache's range deletion
  // takes its markers with it.
  // The key is read under write_mu_, with the write: a cache dropped in
  // between (DropCache moves last_key_ out of its range under it) would
  // otherwise get a marker among its deleted rows, which nothing removes.
  char marker[sizeof(SpillKey::bytes) + 1] = {};
  rocksdb::Status rs;
  {
    MutexLock lock(&write_mu_);
    {
      MutexLock key_lock(&flush_mu_);
      std::memcpy(marker, last_key_.bytes, sizeof last_key_.bytes);
    }
    rs = db_->Put(rocksdb::WriteOptions(), rocksdb::Slice(marker, sizeof marker),
                  rocksdb::Slice());
  }
  if (!rs.ok()) {
    MutexLock lock(&error_mu_);
    error_ = FromRocks(rs, path_).message();
    failed_.store(true);
  }
}

uint64_t SpillStore::UnflushedRows() const { return MemtableEntries(*db_); }

bool SpillStore::TEST_FlushDue() {
  MutexLock lock(&flush_mu_);
  return unflushed_;
}

Status SpillStore::CheckDirectory(uint64_t* free_bytes) const {
  if (Status s = CheckPresent(); !s.ok()) return s;
  return ReadFreeBytes(free_bytes);
}

Status SpillStore::CheckPresent() const {
  // Through the descriptor Open kept, not the name: a directory removed
  // (rm -rf of the spill dir) and made again under the same name is still
  // the one that was removed.
  struct stat st {};
  if (fstat(dir_fd_, &st) != 0) {
    return Status::IOError(fmt::format("cannot look at the spill database {}: {}", path_,
                                       std::strerror(errno)));
  }
  if (st.st_nlink == 0) {
    return Status::IOError(fmt::format(
        "the spill database {} was removed while this server used it (its directory "
        "is gone); spilling stopped, rows in memory stay readable; restart the server "
        "to spill again",
        path_));
  }
  return Status::OK();
}

Status SpillStore::ReadFreeBytes(uint64_t* free_bytes) const {
  struct statvfs v {};
  if (fstatvfs(dir_fd_, &v) != 0) {
    return Status::IOError(
        fmt::format("cannot read the free space of {}: {}", path_, std::strerror(errno)));
  }
  space_reads_.fetch_add(1, std::memory_order_relaxed);
  *free_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
  return Status::OK();
}

Status SpillStore::FreeBytesFor(uint64_t bytes, uint64_t* free_bytes) {
  MutexLock lock(&space_mu_);
  const auto now = std::chrono::steady_clock::now();
  const uint64_t total = memtables_.total();
  const uint64_t spare = space_read_ > total ? space_read_ - total : 0;
  if (!space_known_ || now - space_read_at_ >= kSpaceReadInterval ||
      written_since_ + bytes > spare / 4) {
    Status s = ReadFreeBytes(&space_read_);
    if (!s.ok()) return s;
    space_known_ = true;
    space_read_at_ = now;
    written_since_ = 0;
  }
  *free_bytes = space_read_ - std::min(written_since_, space_read_);
  written_since_ += bytes;
  return Status::OK();
}

Status SpillStore::Open(const std::string& path, std::unique_ptr<SpillStore>* out,
                        bool create, std::string* tightened) {
  // Before RocksDB sees the path, which it opens, fills and (DestroyDB)
  // empties by name: nobody else may be able to swap a directory on the way
  // for a link, and the database's own name must hold a directory of ours
  // (in a shared spill dir another user may have put hers there, or a link
  // to a third user's directory).
  Status s = CheckNoOtherUserCanReplace(path);
  if (!s.ok()) return Status::PermissionDenied("spill database: " + s.message());
  int dir_fd = -1;
  s = OpenOwnedDir(path, create,
                   "remove it (as its owner or root) or start the server with another "
                   "-s DIR",
                   &dir_fd, tightened);
  if (!s.ok()) return s;
  std::unique_ptr<SpillStore> store(new SpillStore());
  store->path_ = path;
  store->dir_fd_ = dir_fd;  // closed by ~SpillStore from here on
  uint64_t free_bytes = 0;
  s = store->CheckDirectory(&free_bytes);
  if (!s.ok()) return s;
  store->memtables_ = MemtablesFor(free_bytes);
  KeepMemtableMemory(store->memtables_);
  rocksdb::Options opts = SpillDbOptions();
  opts.create_if_missing = create;
  opts.IncreaseParallelism(2);
  opts.write_buffer_size = store->memtables_.bytes;
  opts.max_write_buffer_number = store->memtables_.count;
  rocksdb::DB* db = nullptr;
  rocksdb::Status rs = rocksdb::DB::Open(opts, path, &db);
  if (!rs.ok()) return FromRocks(rs, path);
  store->db_.reset(db);
  SpillStore* raw = store.get();
  store->flusher_ = std::thread([raw] { raw->FlushWhenIdle(); });
  *out = std::move(store);
  return Status::OK();
}

Status SpillStore::Put(uint32_t cache_id, uint64_t row_id,
                       std::span<const std::byte> row) {
  rocksdb::WriteBatch batch;
  SpillKey k(cache_id, row_id);
  batch.Put(k.slice(),
            rocksdb::Slice(reinterpret_cast<const char*>(row.data()), row.size()));
  return Write(&batch, row.size(), k);
}

Status SpillStore::Write(rocksdb::WriteBatch* batch, uint64_t bytes,
                         const SpillKey& last) {
  if (failed_.load()) {
    MutexLock lock(&error_mu_);
    return Status::Full("spilling is off after an earlier error: " + error_);
  }
  // Room for the rows in the WAL and for flushing every memtable.
  uint64_t need = bytes + memtables_.total();
  uint64_t free_bytes = 0;
  Status gone = CheckPresent();
  if (gone.ok()) gone = FreeBytesFor(bytes, &free_bytes);
  if (!gone.ok()) {
    MutexLock lock(&error_mu_);
    if (!failed_.exchange(true)) error_ = gone.message();
    return Status::IOError(error_);
  }
  if (free_bytes < need) {
    return Status::Full(
        fmt::format("spill disk full: {} MB free in {}, {} MB needed to go on spilling",
                    free_bytes >> 20, path_, (need + (1 << 20) - 1) >> 20));
  }
  Status s;
  {
    MutexLock lock(&write_mu_);
    s = FromRocks(db_->Write(rocksdb::WriteOptions(), batch), path_);
  }
  if (!s.ok()) {
    MutexLock lock(&error_mu_);
    error_ = s.message();
    failed_.store(true);
    return s;
  }
  MutexLock lock(&flush_mu_);
  last_write_ = std::chrono::steady_clock::now();
  last_key_ = last;
  if (!unflushed_) {
    unflushed_ = true;
    flush_cv_.Signal();
  }
  return s;
}

Status SpillStore::MultiGet(uint32_t cache_id, std::span<const uint64_t> ids,
                            std::vector<std::string>* values,
                            std::vector<Status>* statuses) {
  std::vector<SpillKey> keys;
  keys.reserve(ids.size());
  std::vector<rocksdb::Slice> slices;
  slices.reserve(ids.size());
  for (uint64_t id : ids) {
    keys.emplace_back(cache_id, id);
    slices.push_back(keys.back().slice());
  }
  values->assign(ids.size(), {});
  statuses->assign(ids.size(), Status::OK());
  std::vector<rocksdb::Status> st = db_->MultiGet(rocksdb::ReadOptions(), slices, values);
  for (size_t i = 0; i < st.size(); ++i) {
    // MultiGet may give one block's error to every key it read with that
    // block: each such row is read again on its own, so that a bad block
    // fails only the rows in it.
    if (!st[i].ok() && !st[i].IsNotFound()) {
      st[i] = db_->Get(rocksdb::ReadOptions(), slices[i], &(*values)[i]);
    }
    if (!st[i].ok()) (*statuses)[i] = FromRocks(st[i], path_);
  }
  return Status::OK();
}

Status SpillStore::DropCache(uint32_t cache_id) {
  SpillKey begin(cache_id, 0);
  SpillKey end(cache_id + 1, 0);  // cache ids never reach 2^32 - 1
  rocksdb::Slice b = begin.slice(), e = end.slice();
  rocksdb::Status s;
  {
    MutexLock lock(&write_mu_);
    s = db_->DeleteRange(rocksdb::WriteOptions(), db_->DefaultColumnFamily(), b, e);
    // The marker of a flush still due (the cache's rows were the last
    // written, less than kIdleFlushMs ago) goes after the dropped range,
    // where the next cache's rows start, not among the deleted rows: it
    // would stay there, a key of a cache that no longer exists.
    MutexLock key_lock(&flush_mu_);
    if (std::memcmp(last_key_.bytes, begin.bytes, sizeof(cache_id)) == 0) last_key_ = end;
  }
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
  StopFlusher();
  if (db_) {
    db_->Close();
    db_.reset();
  }
  // DestroyDB and remove_all go by name: remove only while the name still
  // holds the directory Open checked and opened.
  struct stat held {
  }, now{};
  if (lstat(path_.c_str(), &now) != 0 && errno == ENOENT) return Status::OK();
  if (fstat(dir_fd_, &held) != 0 || !S_ISDIR(now.st_mode) || now.st_dev != held.st_dev ||
      now.st_ino != held.st_ino) {
    return Status::IOError(fmt::format(
        "{} is no longer the spill database this server opened (it is {}): left in place",
        path_, DescribeEntry(path_)));
  }
  rocksdb::Status s = rocksdb::DestroyDB(path_, rocksdb::Options());
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) return Status::IOError("cannot remove " + path_ + ": " + ec.message());
  return FromRocks(s, path_);
}

}  // namespace shmcache
