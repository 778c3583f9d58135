// TableSet: the index tables of one cache as this process maps them, and
// the lookups over them.
//
// The daemon adds a table whenever the newest one is full (CacheHeader::
// num_tables, published after the file is ready); every table it made
// stays. A row sits in exactly one table, and newer tables are probed
// first. A table is mapped on first need and stays mapped until the
// TableSet is destroyed, so a location once found stays readable.
//
// Thread safety: Lookup, Mapped, FindIn, Prefetch and InsertNewest from any
// thread without a lock; MapNew takes the set's own mutex (LockRank::
// kCacheTables), held only while files are mapped.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "format/index_table.h"
#include "format/instance.h"
#include "format/layout.h"
#include "format/shm_file.h"
#include "lib/fork_safety.h"
#include "shmcache/status.h"

namespace shmcache {

class TableSet {
 public:
  // `header` is the cache's (mapped by the caller, outliving this set);
  // `paths` names the instance's files when a table is mapped (a client
  // that reconnected may see a new shm prefix).
  TableSet(const layout::CacheHeader* header, uint32_t cache_id,
           std::function<InstancePaths()> paths);
  TableSet(const TableSet&) = delete;
  TableSet& operator=(const TableSet&) = delete;

  // Maps the tables the daemon published since the last call. Corruption
  // when a table file does not match its entry in the header (the tables
  // mapped before stay, and are still right); IOError when one cannot be
  // opened.
  Status MapNew() EXCLUDES(mu_);

  // The published location of `id`, newest table first, or kEmpty; maps
  // the tables the daemon added first.
  uint64_t Lookup(uint64_t id) { return LookupIn(id, Mapped()); }
  // Lookup in the tables mapped now, mapping none: the hit path's. A row in
  // a table not mapped yet is not found here; a caller that takes a miss
  // for an answer asks Lookup. Always inlined, like the rest of the
  // single-row hit path (gcc had called it from View): the fewer
  // instructions a hit takes, the sooner the next hit's misses start
  // (docs/hit-path.md).
  [[gnu::always_inline]] uint64_t LookupMapped(uint64_t id) const {
    return LookupIn(id, num_tables_.load(std::memory_order_acquire));
  }
  // How many tables are mapped, after mapping those the daemon added (a
  // failure to map leaves the tables mapped before, which are still right).
  uint32_t Mapped() {
    const uint32_t n = num_tables_.load(std::memory_order_acquire);
    if (n < header_->num_tables.load(std::memory_order_acquire)) [[unlikely]] {
      return MapForLookup();
    }
    return n;
  }
  // Lookup in the first n mapped tables, newest first, without prefetching:
  // for callers that prefetched the slots themselves. REQUIRES: n <=
  // Mapped().
  uint64_t FindIn(uint64_t id, uint32_t n) const {
    for (uint32_t i = n; i-- > 0;) {
      const uint64_t loc = tables_[i].Find(id);
      if (loc != layout::kEmpty) return loc;
    }
    return layout::kEmpty;
  }
  // Starts loading the home slot of `id` in each of the first n tables.
  void Prefetch(uint64_t id, uint32_t n) const {
    for (uint32_t i = n; i-- > 0;) tables_[i].Prefetch(id);
  }
  // Publishes id -> loc in the newest mapped table; *tables is how many
  // were mapped then. kTableFull: that table is full, the index must grow
  // past *tables (GrowIndexRequest::seen_tables) before a retry.
  // REQUIRES: Mapped() > 0.
  IndexTable::InsertResult InsertNewest(uint64_t id, uint64_t loc, uint32_t* tables) {
    const uint32_t n = num_tables_.load(std::memory_order_acquire);
    *tables = n;
    return tables_[n - 1].Insert(id, loc);
  }

 private:
  // Lookup in the first n mapped tables, with their home slots prefetched
  // first. Always inlined: the compiler would call it from View's hit path.
  [[gnu::always_inline]] uint64_t LookupIn(uint64_t id, uint32_t n) const {
    if (n == 1) [[likely]] {
      return tables_[0].Find(id);
    }
    // A row sits in one table: start every table's probe at once, so a row
    // in an old table costs one memory latency, not one per newer table.
    uint64_t home[layout::kMaxTables];
    for (uint32_t i = 0; i < n; ++i) {
      home[i] = tables_[i].Home(id);
      tables_[i].PrefetchSlot(home[i]);
    }
    for (uint32_t i = n; i-- > 0;) {
      const uint64_t loc = tables_[i].FindFrom(id, home[i]);
      if (loc != layout::kEmpty) return loc;
    }
    return layout::kEmpty;
  }
  // MapNew for the lookups: how many tables are mapped afterwards.
  uint32_t MapForLookup();

  const layout::CacheHeader* const header_;
  const uint32_t cache_id_;
  const std::function<InstancePaths()> paths_;
  // tables_[i] is written under mu_ before num_tables_ counts it, and read
  // without mu_ after: only the files are GUARDED_BY.
  ForkSafeMutex mu_{LockRank::kCacheTables};
  std::atomic<uint32_t> num_tables_{0};
  IndexTable tables_[layout::kMaxTables];
  ShmFile files_[layout::kMaxTables] GUARDED_BY(mu_);
};

}  // namespace shmcache
