// The spill side: puts and gets against the RocksDB spill store, and at
// start the reconciling of the adopted index with the spill database this
// server uses.
#include "daemon/cache_spiller.h"

#include <unistd.h>

#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <rocksdb/write_batch.h>

#include "daemon/cache_state.h"
#include "daemon/logger.h"
#include "daemon/spill_record.h"
#include "format/row_codec.h"
#include "format/spill_format.h"

namespace shmcache {

CacheSpiller::CacheSpiller(const InstancePaths& paths, Logger* log)
    : paths_(paths), log_(log) {}

Status CacheSpiller::Open(const std::string& spill_dir, const NoteFn& note) {
  std::string refused;
  recorded_ = ReadSpillRecord(paths_, &refused);
  if (!refused.empty()) {
    // Without a record the adopted spilled rows count as unreadable.
    note("ignored the spill record: " + refused);
    unlink(paths_.SpillRecordFile().c_str());
  }
  if (spill_dir.empty()) return Status::OK();
  std::string tightened;
  Status s = SpillStore::Open(SpillDbPath(spill_dir, paths_.port), &spill_,
                              /*create=*/true, &tightened);
  if (!tightened.empty()) log_->Info("spill database: {}", tightened);
  return s;
}

void CacheSpiller::Shutdown() {
  // A record left behind makes the next start look for this database (and
  // remove it, if it is still there): say so.
  Status r = WriteSpillRecord(paths_, "");
  if (!r.ok()) log_->Warn("{}", r.message());
  if (spill_) {
    Status s = spill_->DestroyAll();
    if (!s.ok()) log_->Warn("{}", s.message());
    spill_.reset();
  }
}

Status CacheSpiller::Put(uint32_t cache_id, CacheState* c, uint64_t row_id,
                         std::span<const std::byte> row, MemoryAccount* account,
                         bool* inserted) {
  *inserted = false;
  if (!spill_ || !c->spilling_on()) {
    return Status::Full(fmt::format("{} is full and does not spill", c->Label()));
  }
  Status s = spill_->Put(cache_id, row_id, row);
  if (!s.ok()) {
    log_->Error("cache {}: spilling stopped: {}", cache_id, s.message());
    c->StopSpilling(s.message());
    return Status::Full(
        fmt::format("cache {} stopped spilling: {}", cache_id, s.message()));
  }
  return c->PublishSpilled(row_id, row.size(), account, inserted);
}

namespace {

// A RocksDB write batch's bytes beyond its values (write_batch.cc): a
// header of a sequence number and a count, and per entry a type byte, the
// key's and the value's lengths (varint32, at most 5 bytes each) and the
// key.
constexpr size_t kWriteBatchHeaderBytes = 12;
constexpr size_t kWriteBatchEntryBytes = 1 + 5 + sizeof(SpillKey::bytes) + 5;

// Checks the rows of a write batch (its own copy) against the ids and sizes
// they were put under: each must decode whole and carry its id.
class StagedRowCheck : public rocksdb::WriteBatch::Handler {
 public:
  StagedRowCheck(std::span<const uint64_t> ids, std::span<const uint32_t> sizes)
      : ids_(ids), sizes_(sizes) {}
  rocksdb::Status PutCF(uint32_t, const rocksdb::Slice&,
                        const rocksdb::Slice& value) override {
    const size_t i = next_++;
    if (i >= ids_.size() || value.size() != sizes_[i] ||
        !RowCodec::IsRowOf(reinterpret_cast<const std::byte*>(value.data()), value.size(),
                           ids_[i])) {
      bad_ = i;
      return rocksdb::Status::Corruption("staged row");
    }
    return rocksdb::Status::OK();
  }
  size_t bad() const { return bad_; }

 private:
  std::span<const uint64_t> ids_;
  std::span<const uint32_t> sizes_;
  size_t next_ = 0;
  size_t bad_ = 0;
};

}  // namespace

Status CacheSpiller::WriteStaged(uint32_t cache_id, std::span<const std::byte> stage,
                                 std::span<const uint64_t> ids,
                                 std::span<const uint32_t> sizes) {
  if (!spill_) return Status::NotFound("this server does not spill");
  if (ids.size() != sizes.size()) {
    return Status::Corruption("staged rows: as many ids as sizes are needed");
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    // Whole rows (RowCodec sizes are multiples of 8) inside the stage.
    if (sizes[i] < kRowHeaderBytes || sizes[i] % 8 != 0 ||
        sizes[i] > stage.size() - bytes) {
      return Status::Corruption(fmt::format(
          "staged row {} (id {}) of {} bytes at offset {} does not fit a stage of {} "
          "bytes",
          i, ids[i], sizes[i], bytes, stage.size()));
    }
    bytes += sizes[i];
  }
  // The batch's buffer whole from the start: grown row by row, it was
  // copied again at each doubling, which came to a second copy of the rows
  // (callgrind: WriteBatch::Put 14-17% of the daemon's instructions in a
  // spilling PutBatch of 3 KB and 150 KB rows; docs/spill-reads.md).
  rocksdb::WriteBatch batch(kWriteBatchHeaderBytes + ids.size() * kWriteBatchEntryBytes +
                            bytes);
  uint64_t off = 0;
  SpillKey last(cache_id, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    last = SpillKey(cache_id, ids[i]);
    batch.Put(
        last.slice(),
        rocksdb::Slice(reinterpret_cast<const char*>(stage.data() + off), sizes[i]));
    off += sizes[i];
  }
  StagedRowCheck check(ids, sizes);
  if (!batch.Iterate(&check).ok()) {
    return Status::Corruption(
        fmt::format("staged row {} (id {}) is not a whole row of that id", check.bad(),
                    ids[check.bad()]));
  }
  return spill_->Write(&batch, off, last);
}

Status CacheSpiller::Get(uint32_t cache_id, std::span<const uint64_t> ids,
                         std::vector<std::string>* rows, std::vector<Status>* statuses) {
  if (!spill_) return Status::NotFound("this server does not spill");
  Status s = spill_->MultiGet(cache_id, ids, rows, statuses);
  if (!s.ok()) return s;
  // RocksDB checks its blocks; what a block holds must still be the row.
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& row = (*rows)[i];
    if ((*statuses)[i].ok() &&
        !RowCodec::IsRowOf(reinterpret_cast<const std::byte*>(row.data()), row.size(),
                           ids[i])) {
      (*statuses)[i] = Status::Corruption(
          fmt::format("its {} bytes are not a whole row of that id", row.size()));
    }
  }
  return Status::OK();
}

Status CacheSpiller::DropCache(uint32_t cache_id) {
  if (!spill_) return Status::OK();
  return spill_->DropCache(cache_id);
}

std::vector<uint32_t> CacheSpiller::CacheIds() const {
  if (!spill_) return {};
  return spill_->CacheIds();
}

void CacheSpiller::Reconcile(
    const std::map<uint32_t, std::unique_ptr<CacheState>>& caches, const NoteFn& note) {
  const std::string current = spill_ ? spill_->path() : "";
  // No record: nothing spilled yet, or an index from a server before the
  // record; its rows are served where they are found, as they were then.
  const bool same_db = spill_ && (recorded_.empty() || SameSpillDb(recorded_, current));
  std::set<uint32_t> on_disk;
  for (uint32_t id : CacheIds()) on_disk.insert(id);
  for (const auto& [id, c] : caches) {
    std::string why;  // why its spilled rows cannot be read here
    if (!spill_) {
      why = "this server has no spill directory";
    } else if (!same_db) {
      why = fmt::format("this server spills to {}, not {}", current, recorded_);
    } else if (on_disk.count(id) == 0) {
      why = fmt::format("{} holds none of them", current);
    }
    ReconcileCache(id, c.get(), why, on_disk.count(id) != 0, note);
  }
  if (!recorded_.empty() && !SameSpillDb(recorded_, current)) {
    RemoveEarlierSpillDb(recorded_, note);
  }
  Status s = WriteSpillRecord(paths_, current);
  if (!s.ok()) log_->Error("{}", s.message());
}

void CacheSpiller::ReconcileCache(uint32_t id, CacheState* c, const std::string& why,
                                  bool on_disk, const NoteFn& note) {
  std::vector<std::string> told;
  if (!why.empty()) {
    if (uint64_t n = c->DropSpilledRows()) {
      told.push_back(
          fmt::format("{} spilled rows were dropped ({}); they read as "
                      "misses{}",
                      n, why, spill_ ? " and are cached again when put" : ""));
    }
    // Rows on disk the index no longer points to.
    if (on_disk) {
      Status s = spill_->DropCache(id);
      if (!s.ok()) {
        log_->Warn(
            "cache {}: cannot drop its spilled rows the index no longer points to: {}",
            id, s.message());
      }
    }
  }
  if (!spill_ && c->spill_enabled()) {
    c->StopSpilling("this server has no spill directory");
    told.push_back(
        fmt::format("it no longer spills{} (start the server with -s DIR "
                    "to spill)",
                    c->Stats().full ? " and is full" : ""));
  }
  if (told.empty()) return;
  std::string text = c->Label() + ": " + told[0];
  for (size_t i = 1; i < told.size(); ++i) text += "; " + told[i];
  note(text);
}

void CacheSpiller::RemoveEarlierSpillDb(const std::string& path, const NoteFn& note) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  if (!IsSpillDbOf(path, paths_.port)) {
    note(
        fmt::format("left {} in place: it is not named as a spill database of "
                    "this server",
                    path));
    return;
  }
  // Opening it first takes its lock: a database another process uses is
  // never removed.
  std::unique_ptr<SpillStore> old;
  Status s = SpillStore::Open(path, &old, /*create=*/false);
  bool had_rows = s.ok() && !old->CacheIds().empty();
  if (s.ok()) s = old->DestroyAll();
  if (!s.ok()) {
    note(
        fmt::format("cannot remove {}, the earlier server's spill database: {}; "
                    "remove it once no server uses it",
                    path, s.message()));
  } else if (had_rows) {
    note(fmt::format("removed {}, the earlier server's spill database", path));
  } else {
    log_->Info("removed {}, the earlier server's spill database (empty)", path);
  }
}

}  // namespace shmcache
