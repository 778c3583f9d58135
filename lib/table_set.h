// TableSet: the index tables of one cache as this process maps them, and
// the lookups over them.
//
// The daemon adds a table whenever the newest one is full (CacheHeader::
// num_tables, published after the file is ready), copies the rows of the
// older tables into it, and then raises CacheHeader::first_table to it and
// frees the older tables' slots (daemon/cache_state_index.cc). Lookups probe
// only the tables from first_table on, oldest first (LookupIn says why):
// after a compaction, one table. A row sits in one table of that range (or, during a
// copy, in two, with the same location). A table is mapped on first need and stays mapped
// until the TableSet is destroyed, so a location once found stays readable; a table below
// first_table reads as empty (its slots were freed), so a lookup whose mapped tables all
// lie below it misses, and the caller's full path (Lookup) maps the newer tables and
// finds the row. Lookup itself rechecks a miss against first_table (LookupFrom): its
// range, too, may have been compacted away between its read and its probe.
//
// Thread safety: Lookup, Mapped, Range, FindIn, Prefetch, InsertNewest,
// Publish and Republish from any thread without a lock; MapNew takes the set's own mutex
// (LockRank::kCacheTables), held only while files are mapped.
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

  // The tables a lookup probes: [first, end), end > first.
  struct Range {
    uint32_t first;
    uint32_t end;
  };

  // The published location of `id`, or kEmpty; maps the tables the daemon
  // added first.
  uint64_t Lookup(uint64_t id) { return LookupFrom(id, CurrentRange()); }
  // Lookup in range r, which CurrentRange() returned at the call's start.
  // A miss there stands only while the daemon has not compacted the index
  // since: a compaction raises first_table and then frees the slots of the
  // tables below it, so a probe that came after the free reads zeros
  // (empty slots) where the row was. Each compaction since r was read, the
  // row is looked for again in the tables as they are now (the newest
  // holds every row of those it compacted away). Bounded: first_table only
  // rises, at most kMaxTables times.
  uint64_t LookupFrom(uint64_t id, Range r) {
    for (;;) {
      const uint64_t loc = LookupIn(id, r.first, r.end);
      if (loc != layout::kEmpty) [[likely]] {
        return loc;
      }
      // After the probe's slot loads (acquire, each): a probe that read a
      // slot the daemon freed (its release store of kEmpty in the first
      // page, or MADV_REMOVE's zeros past it) reads the first_table the
      // daemon raised before that free. Unmoved (r.first is first_table
      // unless that table could not be mapped): a miss.
      if (header_->first_table.load(std::memory_order_acquire) == r.first) [[likely]] {
        return layout::kEmpty;
      }
      const Range now = CurrentRange();
      if (now.first == r.first) return layout::kEmpty;
      r = now;
    }
  }
  // Lookup in the tables mapped now, mapping none: the hit path's. A row in
  // a table not mapped yet is not found here; a caller that takes a miss
  // for an answer asks Lookup. Always inlined, like the rest of the
  // single-row hit path (gcc had called it from View): the fewer
  // instructions a hit takes, the sooner the next hit's misses start
  // (docs/hit-path.md).
  [[gnu::always_inline]] uint64_t LookupMapped(uint64_t id) const {
    // The range this process saw last (Refresh): after a compaction, one
    // table. Stale after the next one, it probes a table whose slots were
    // freed: a miss, and the caller's full path refreshes it.
    if (const IndexTable* t = lone_.load(std::memory_order_acquire)) [[likely]] {
      return t->Find(id);
    }
    return LookupSeveral(id);
  }
  // The one table LookupMapped probes when it probes one (after a
  // compaction), else nullptr.
  [[gnu::always_inline]] const IndexTable* LoneMapped() const {
    return lone_.load(std::memory_order_acquire);
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
  // The tables to probe now, after mapping those the daemon added: every
  // row published before the call is in one of them until the daemon
  // compacts them away (then LookupFrom looks again). first_table is read
  // before the tables are counted, so the table it names is mapped (the
  // daemon publishes a table before it raises first_table to it) unless it
  // could not be (then the range is the mapped tables, whose slots may
  // have been freed: misses, never wrong rows).
  Range CurrentRange() {
    const uint32_t first = header_->first_table.load(std::memory_order_acquire);
    const uint32_t end = Mapped();
    const Range r{first < end ? first : end - 1, end};
    if (r.first != first_.load(std::memory_order_relaxed) ||
        Lone(r) != lone_.load(std::memory_order_relaxed)) [[unlikely]] {
      Refresh(r);
    }
    return r;
  }
  // Lookup in range r, oldest first (see LookupIn), without prefetching:
  // for callers that prefetched the slots themselves. REQUIRES: r from
  // CurrentRange().
  uint64_t FindIn(uint64_t id, Range r) const {
    for (uint32_t i = r.first; i < r.end; ++i) {
      const uint64_t loc = tables_[i].Find(id);
      if (loc != layout::kEmpty) return loc;
    }
    return layout::kEmpty;
  }
  // Table i. REQUIRES: i < Mapped().
  const IndexTable& table(uint32_t i) const { return tables_[i]; }
  // Starts loading the home slot of `id` in each table of r.
  [[gnu::always_inline]] void Prefetch(uint64_t id, Range r) const {
    for (uint32_t i = r.end; i-- > r.first;) tables_[i].Prefetch(id);
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
  // What Publish did with a row.
  enum class Published {
    // Published in the newest table the header counted after the store:
    // every lookup from then on finds it.
    kInserted,
    // The id was published already (the first row of an id wins): this
    // row was not.
    kExists,
    // Nothing published: the newest mapped table is full; grow the index
    // past *tables (GrowIndexRequest::seen_tables) and Publish again.
    kTableFull,
    // Published, but only in a table older than the newest, which filled
    // (or could not be mapped) before the row reached it: the daemon may
    // have copied the older table without the row and lookups probe only
    // the newest, so the row may read as a miss. Its room is the row's (a
    // reader may have found it). Grow the index past *tables and
    // Republish.
    kBehind,
  };
  // InsertNewest, and then, while a table newer than the one it published
  // in exists, the same in the newest: the daemon may have copied that
  // table into the newer one before this row was in it, and lookups probe
  // only the newest once it has (see CacheState::CompactIndex for the
  // other half). *tables: how many tables were mapped when it stopped.
  Published Publish(uint64_t id, uint64_t loc, uint32_t* tables);
  // For a row Publish (or Republish) answered kBehind, once the index grew
  // past *tables: publishes it in the newest table, as Publish does.
  // kInserted also where that table holds the id already (the daemon's
  // copy, or another writer of the id, put it there); kBehind again where
  // no table past *tables can be mapped, or the newest filled (or could
  // not be mapped) before the row reached it.
  Published Republish(uint64_t id, uint64_t loc, uint32_t* tables);

 private:
  // Lookup in tables [first, n), with their home slots prefetched first.
  // Always inlined: the compiler would call it from View's hit path.
  [[gnu::always_inline]] uint64_t LookupIn(uint64_t id, uint32_t first,
                                           uint32_t n) const {
    if (n - first == 1) [[likely]] {
      return tables_[first].Find(id);
    }
    // A row sits in one table: start every table's probe at once, so a row
    // in an old table costs one memory latency, not one per newer table.
    uint64_t home[layout::kMaxTables];
    for (uint32_t i = first; i < n; ++i) {
      home[i] = tables_[i].Home(id);
      tables_[i].PrefetchSlot(home[i]);
    }
    // Oldest first: the daemon copies a table's rows into a newer one
    // before it frees the table's slots, so the oldest table holding a row
    // only rises while this runs. A miss in table i means the row is in a
    // later one by then (or was not published): probed in this order, a
    // compaction under way cannot hide a row published before the lookup
    // began, as newest first could (the newest probed before the copy
    // reached the row, the older one after its slots were freed).
    for (uint32_t i = first; i < n; ++i) {
      const uint64_t loc = tables_[i].FindFrom(id, home[i]);
      if (loc != layout::kEmpty) return loc;
    }
    return layout::kEmpty;
  }
  // Publish's second half: the row is published in table *tables - 1;
  // carries it into each newer table the header counts.
  Published Follow(uint64_t id, uint64_t loc, uint32_t* tables);
  // MapNew for the lookups: how many tables are mapped afterwards.
  uint32_t MapForLookup();
  // The hit path's lookup in several tables (not compacted, or compacted
  // since this process looked): the range from the header's first table on,
  // refreshed for the next hits; kEmpty when that table is not mapped here
  // (the full path maps it).
  uint64_t LookupSeveral(uint64_t id) const {
    const uint32_t n = num_tables_.load(std::memory_order_acquire);
    const uint32_t first = header_->first_table.load(std::memory_order_acquire);
    if (first >= n) return layout::kEmpty;
    if (first != first_.load(std::memory_order_relaxed)) Refresh({first, n});
    return LookupIn(id, first, n);
  }
  const IndexTable* Lone(Range r) const {
    return r.end - r.first == 1 ? &tables_[r.first] : nullptr;
  }
  // Sets the hit path's range to r (REQUIRES: r.end tables mapped).
  void Refresh(Range r) const {
    first_.store(r.first, std::memory_order_release);
    lone_.store(Lone(r), std::memory_order_release);
  }

  const layout::CacheHeader* const header_;
  const uint32_t cache_id_;
  const std::function<InstancePaths()> paths_;
  // tables_[i] is written under mu_ before num_tables_ counts it, and read
  // without mu_ after: only the files are GUARDED_BY.
  ForkSafeMutex mu_{LockRank::kCacheTables};
  std::atomic<uint32_t> num_tables_{0};
  // The hit path's range, from the last CurrentRange or MapNew: its first
  // table, and that table when it is the only one (else nullptr). Either
  // may be stale (misses, then the full path refreshes them); first_ is
  // always below num_tables_.
  mutable std::atomic<uint32_t> first_{0};
  mutable std::atomic<const IndexTable*> lone_{nullptr};
  IndexTable tables_[layout::kMaxTables];
  ShmFile files_[layout::kMaxTables] GUARDED_BY(mu_);
};

}  // namespace shmcache
