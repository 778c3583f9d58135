// Spilled rows: puts and gets against the RocksDB spill store, and at start
// the reconciling of the adopted index with the spill database this server
// uses.

#include "store.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "logger.h"
#include "spill_record.h"

namespace shmcache {

Status Store::SpillPut(uint32_t cache_id, uint64_t row_id, std::span<const std::byte> row,
                       bool* inserted) {
  *inserted = false;
  MutexLock lock(&mu_);
  CacheState* c;
  Status s = CacheFor(cache_id, &c);
  if (!s.ok()) return s;
  if (!spill_ || !c->spilling()) {
    return Status::Full(fmt::format("cache {} is full and does not spill", cache_id));
  }
  s = spill_->Put(cache_id, row_id, row);
  if (!s.ok()) {
    log_->Error("cache {}: spilling stopped: {}", cache_id, s.message());
    c->StopSpilling(s.message());
    return Status::Full(
        fmt::format("cache {} stopped spilling: {}", cache_id, s.message()));
  }
  return c->PublishSpilled(row_id, row.size(), &account_, inserted);
}

Status Store::SpillGet(uint32_t cache_id, std::span<const uint64_t> ids,
                       std::vector<std::string>* rows, std::vector<bool>* found) {
  {
    MutexLock lock(&mu_);
    CacheState* c;
    Status s = CacheFor(cache_id, &c);
    if (!s.ok()) return s;
    if (!spill_) return Status::NotFound("this server does not spill");
  }
  // RocksDB is thread-safe; reads need not hold the store's lock. A cache
  // destroyed meanwhile yields misses.
  Status s = spill_->MultiGet(cache_id, ids, rows, found);
  if (s.ok()) CountSpillReads(cache_id, std::count(found->begin(), found->end(), true));
  return s;
}

void Store::CountSpillReads(uint32_t cache_id, uint64_t n) {
  MutexLock lock(&mu_);
  CacheState* c;
  if (n > 0 && CacheFor(cache_id, &c).ok()) c->CountSpillReads(n);
}

void Store::ReconcileSpill(const std::string& recorded) {
  const std::string current = spill_ ? spill_->path() : "";
  // No record: nothing spilled yet, or an index from a server before the
  // record; its rows are served where they are found, as they were then.
  const bool same_db = spill_ && (recorded.empty() || SameSpillDb(recorded, current));
  std::set<uint32_t> on_disk;
  if (spill_) {
    for (uint32_t id : spill_->CacheIds()) on_disk.insert(id);
  }
  for (auto& [id, c] : caches_) {
    std::string why;  // why its spilled rows cannot be read here
    if (!spill_) {
      why = "this server has no spill directory";
    } else if (!same_db) {
      why = fmt::format("this server spills to {}, not {}", current, recorded);
    } else if (on_disk.count(id) == 0) {
      why = fmt::format("{} holds none of them", current);
    }
    ReconcileCacheSpill(id, c.get(), why, on_disk.count(id) != 0);
  }
  if (!recorded.empty() && !SameSpillDb(recorded, current)) {
    RemoveEarlierSpillDb(recorded);
  }
  Status s = WriteSpillRecord(paths_, current);
  if (!s.ok()) log_->Error("{}", s.message());
}

void Store::ReconcileCacheSpill(uint32_t id, CacheState* c, const std::string& why,
                                bool on_disk) {
  std::vector<std::string> told;
  if (!why.empty()) {
    if (uint64_t n = c->DropSpilledRows()) {
      told.push_back(
          fmt::format("{} spilled rows were dropped ({}); they read as "
                      "misses{}",
                      n, why, spill_ ? " and are cached again when put" : ""));
    }
    // Rows on disk the index no longer points to.
    if (on_disk) spill_->DropCache(id).PermitUncheckedError();
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
  Note(text);
}

void Store::RemoveEarlierSpillDb(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  if (!IsSpillDbOf(path, paths_.port)) {
    Note(
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
    Note(
        fmt::format("cannot remove {}, the earlier server's spill database: {}; "
                    "remove it once no server uses it",
                    path, s.message()));
  } else if (had_rows) {
    Note(fmt::format("removed {}, the earlier server's spill database", path));
  } else {
    log_->Info("removed {}, the earlier server's spill database (empty)", path);
  }
}

}  // namespace shmcache
