// CacheSpiller: the spill side of the daemon. It owns the SpillStore (the
// RocksDB database rows go to once a cache's memory is used up) and the
// spill record that says which database an instance's index points into:
// rows written and published, read back, dropped with their cache, and at
// start the reconciling of adopted caches' spilled rows with the database
// this server uses.
//
// Without a spill directory there is no store: puts are refused (Full),
// gets are NotFound, drops do nothing.
//
// Thread safety: Open and Shutdown run when no request does (Store::Init,
// Store::Shutdown). Put and Reconcile change CacheStates, so they run under
// the lock that guards those (the Store's mutex). Get, DropCache and
// CacheIds go through the SpillStore alone, which is thread-safe, and need
// no lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/memory_account.h"
#include "daemon/spill_store.h"
#include "format/instance.h"
#include "shmcache/status.h"

namespace shmcache {

class CacheState;
class Logger;

class CacheSpiller {
 public:
  // Takes a line for startup_notes(): logged as a warning and kept.
  using NoteFn = std::function<void(const std::string&)>;

  CacheSpiller(const InstancePaths& paths, Logger* log);

  // Reads the spill record an earlier server left (a record that cannot be
  // trusted is noted and removed), then opens the spill store in
  // `spill_dir` unless it is empty. An error opening it is returned.
  Status Open(const std::string& spill_dir, const NoteFn& note);
  // After adoption: drops the adopted spilled rows this server cannot read
  // (another database, or none), turns spilling off without a spill store,
  // removes the earlier server's spill database when it is not this
  // server's, and records this server's.
  void Reconcile(const std::map<uint32_t, std::unique_ptr<CacheState>>& caches,
                 const NoteFn& note);
  // Removes the spill record and every spilled row; the store is closed.
  void Shutdown();

  bool enabled() const { return spill_ != nullptr; }
  // Writes a row that did not fit in memory to the spill store and
  // publishes it in cache `c` (id `cache_id`). Full when the cache does not
  // spill or there is no store; when the write fails, the cache stops
  // spilling and Full says why.
  Status Put(uint32_t cache_id, CacheState* c, uint64_t row_id,
             std::span<const std::byte> row, MemoryAccount* account, bool* inserted);
  // Writes rows ids[i] of sizes[i] bytes, encoded back to back from the
  // start of `stage` (a client's staging file), to the spill store in one
  // batch; the caller publishes them. The rows are copied out of the stage
  // first and checked in the copy (each decodes whole and carries its id):
  // the client may write into its stage meanwhile. Corruption (nothing
  // written) when one is not; NotFound without a store; otherwise what
  // SpillStore::Write says. Touches no CacheState: needs no lock.
  Status WriteStaged(uint32_t cache_id, std::span<const std::byte> stage,
                     std::span<const uint64_t> ids, std::span<const uint32_t> sizes);
  // Rows ids[i] of cache `cache_id` into (*rows)[i], with (*statuses)[i]
  // as SpillStore::MultiGet says, or Corruption for a value read whole
  // that is not a whole row of its id (RowCodec::IsRowOf): what the caller
  // drops (Store::SpillGet). NotFound without a store.
  Status Get(uint32_t cache_id, std::span<const uint64_t> ids,
             std::vector<std::string>* rows, std::vector<Status>* statuses);
  // Deletes the spilled rows of `cache_id`; OK without a store.
  Status DropCache(uint32_t cache_id);
  // The caches with rows in the store; none without one.
  std::vector<uint32_t> CacheIds() const;

 private:
  // For one adopted cache: drops its spilled rows when `why` (they cannot
  // be read here) is set, and their copies from this server's database
  // when `on_disk`; turns its spilling off without a spill store; notes it.
  void ReconcileCache(uint32_t id, CacheState* c, const std::string& why, bool on_disk,
                      const NoteFn& note);
  void RemoveEarlierSpillDb(const std::string& path, const NoteFn& note);

  InstancePaths paths_;
  Logger* log_;
  std::string recorded_;  // the earlier server's database, read by Open
  // Set by Open and reset by Shutdown, when no request runs.
  std::unique_ptr<SpillStore> spill_;
};

}  // namespace shmcache
