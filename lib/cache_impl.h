// CacheImpl: one open cache in this process: its header, index tables and
// data segments mapped, and the chunks this process writes into.
//
// Hot paths (Get, View, Contains) take no lock and make no system call once
// the segments they touch are mapped. Put takes a process-local mutex (a
// killed process takes it with it; fork() waits until no thread holds it)
// and calls the daemon only to lease a new chunk or grow the index.
//
// Implemented in cache_impl.cc (attach, mapping, statistics), cache_read.cc,
// cache_put.cc (the chunk writer) and cache_spill.cc (the spill requests;
// rows to disk go through spill_stage.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "format/index_table.h"
#include "format/layout.h"
#include "format/shm_file.h"
#include "lib/client_impl.h"
#include "lib/fork_safety.h"
#include "lib/segment_map.h"
#include "lib/spill_stage.h"
#include "shmcache/row.h"
#include "shmcache/stats.h"
#include "shmcache/types.h"

namespace shmcache {

class CacheImpl {
 public:
  static Status Attach(const std::shared_ptr<ClientImpl>& client, uint32_t cache_id,
                       uint32_t session_id, std::shared_ptr<CacheImpl>* out);
  ~CacheImpl();

  // PutRow, counting a Full answer in this process's statistics line.
  Status Put(uint64_t id, std::span<const ColumnRef> columns, bool* inserted);
  Status PutBatch(std::span<const uint64_t> ids,
                  std::span<const std::span<const ColumnRef>> rows, Status* statuses,
                  bool* inserted);
  Status Get(uint64_t id, std::span<const std::string_view> columns, bool project,
             Row* out);
  Status View(uint64_t id, RowView* out);
  // count=false: GetBatchUncounted (cache.h).
  Status GetBatch(std::span<const uint64_t> ids, Row* rows, Status* statuses,
                  bool count = true);
  Status ViewBatch(std::span<const uint64_t> ids, RowView* views, Status* statuses);
  bool Contains(uint64_t id);
  Status GetStats(CacheStats* out);
  bool IsFull() const;
  void Close() EXCLUDES(put_mu_);

  uint32_t cache_id() const { return cache_id_; }
  uint32_t session_id() const { return session_id_; }

 private:
  struct Chunk {
    uint32_t seg_no = 0;
    uint64_t offset = 0;   // of the chunk inside its segment
    char* base = nullptr;  // chunk start
    uint64_t size = 0;
    uint64_t used = 0;
    layout::ChunkHeader* header = nullptr;
  };

  // Batches are looked up in windows: enough ids to overlap their misses,
  // few enough that the prefetched lines are still in cache when used.
  static constexpr size_t kBatchWindow = 32;

  CacheImpl(std::shared_ptr<ClientImpl> client, uint32_t cache_id, uint32_t session_id);
  // NotFound for a row that is not cached.
  static Status Miss(uint64_t id);
  Status Usable() const;
  // The published location of `id`, newest table first, or kEmpty. Inline,
  // like the rest of the single-row hit path: the fewer instructions a hit
  // takes, the sooner the next hit's misses start (docs/hit-path.md).
  uint64_t Lookup(uint64_t id) {
    const uint32_t n = MappedTables();
    // A row sits in one table: start every table's probe at once, so a row
    // in an old table costs one memory latency, not one per newer table.
    if (n > 1) {
      for (uint32_t i = n; i-- > 0;) tables_[i].Prefetch(id);
    }
    return FindInTables(id, n);
  }
  // How many index tables are mapped, after mapping those the daemon added.
  uint32_t MappedTables() {
    const uint32_t n = num_tables_.load(std::memory_order_acquire);
    if (n < header_->num_tables.load(std::memory_order_acquire)) [[unlikely]] {
      return MapTablesForLookup();
    }
    return n;
  }
  // Lookup in the first n tables, newest first, without prefetching: for
  // callers that prefetched the slots themselves (LookupBatch).
  uint64_t FindInTables(uint64_t id, uint32_t n) const {
    for (uint32_t i = n; i-- > 0;) {
      const uint64_t loc = tables_[i].Find(id);
      if (loc != layout::kEmpty) return loc;
    }
    return layout::kEmpty;
  }
  // Maps the tables the daemon added; returns how many are mapped now (a
  // mapping failure leaves the tables we have, which are still right).
  uint32_t MapTablesForLookup();
  // Lookup for a read: the location, or NotFound (a counted miss), or why
  // the cache cannot be used.
  Status Locate(uint64_t id, uint64_t* loc);
  // Lookup of a batch with its memory misses overlapped: every id's index
  // slot is prefetched before any is probed, and every row's header before
  // any is read.
  void LookupBatch(std::span<const uint64_t> ids, uint64_t* locs);
  Status MapNewTables() EXCLUDES(map_mu_);
  Status Resolve(uint64_t id, uint64_t loc, RowView* view, int* node);
  // The hit path: views row `id` when it is in memory, in a segment this
  // process has mapped, and the cache is usable; builds no Status and
  // counts nothing. False otherwise: the caller takes the full path, which
  // tells a miss, a spilled row and every error apart. Defined in
  // cache_read.cc, always inlined into Get and View there; not callable
  // from other files.
  inline bool FindInMemory(uint64_t id, RowView* view, int* node);
  // Get and View past the hit path: a projection, a miss, a spilled row, a
  // segment not mapped yet, or an error. Out of line, so that the hit path
  // saves no registers for them.
  [[gnu::noinline]] Status GetSlow(uint64_t id, std::span<const std::string_view> columns,
                                   bool project, Row* out);
  [[gnu::noinline]] Status ViewSlow(uint64_t id, RowView* out);
  Status SegmentFor(uint32_t seg_no, const MappedSegment** out) EXCLUDES(map_mu_);
  Status LeaseChunk(int node, size_t need, Chunk* out) REQUIRES(put_mu_);
  // Rows and bytes a batch added to memory, counted into the statistics
  // once per batch rather than once per row. A row that goes to disk is not
  // put by PutRow: it sets to_disk (and its encoded size), and the batch
  // stages its rows for disk together once the rest are in (SpillRows).
  struct PutTally {
    uint64_t rows = 0;
    uint64_t bytes = 0;
    bool to_disk = false;
    size_t disk_bytes = 0;
  };
  using PutLock = std::unique_lock<ForkSafeMutex>;
  // One row of a batch; `loc` is where the index had the id before the
  // batch took the lock (kEmpty: absent). Takes *lock on first need.
  Status PutRow(uint64_t id, std::span<const ColumnRef> columns, uint64_t loc,
                PutLock* lock, PutTally* tally, bool* inserted);
  // Takes put_mu_ unless *lock holds it; a forked child first drops the
  // chunks, which belong to its parent. On return put_mu_ is held (by
  // *lock): a batch takes it on its first row that needs it, which the
  // analysis cannot follow, so this asserts it.
  void LockForPut(PutLock* lock) ASSERT_CAPABILITY(put_mu_);
  // Writes a row of `size` encoded bytes into this process's chunk (leasing
  // a new one when it does not fit) and publishes it in the index.
  Status PutInMemory(uint64_t id, std::span<const ColumnRef> columns, size_t size,
                     PutTally* tally, bool* inserted) REQUIRES(put_mu_);
  Status GrowIndex(uint32_t seen);
  void ReturnChunksLocked() REQUIRES(put_mu_);
  layout::StatsSlot* Stats();
  // The stats lane this thread may count in, or nullptr (another thread
  // of this process owns it, or the process has none).
  layout::StatsLane* OwnLane();
  // Takes lanes[i % kStatsSlots] for this process: free, or its owner gone.
  // nullptr when another live process (or this one) holds it.
  layout::StatsLane* TakeLane(uint32_t i);
  void ReleaseLane();
  void CountRead(bool hit, int node);
  // CountRead(true, node) for the hit path: inline where the calling thread
  // owns this process's stats lane on a single-node host (a plain load and
  // store), CountRead otherwise.
  void CountHit(int node) {
    if (single_node_) {
      if (layout::StatsLane* lane = LaneOfThisThread()) {
        BumpLane(lane->hits);
        return;
      }
    }
    CountRead(true, node);
  }
  // This process's stats lane when the calling thread is the one counting
  // in it and no fork happened since it was taken; nullptr otherwise.
  layout::StatsLane* LaneOfThisThread() const {
    if (lane_thread_.load(std::memory_order_relaxed) == __builtin_thread_pointer() &&
        stats_fork_gen_.load(std::memory_order_relaxed) == ForkGeneration()) {
      return lane_.load(std::memory_order_relaxed);
    }
    return nullptr;
  }
  // A lane's one writer counts with a plain load and store: no locked add,
  // which would fence this hit's misses off from the next one's.
  static void BumpLane(std::atomic<uint64_t>& c) {
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  // Counts `n` spilled rows read from the spill database in this process
  // (in its stats lane; a process without one, e.g. the cache's second
  // opening in one process, does not count them). Any thread.
  void CountSpillReads(uint64_t n);
  // Reads spilled rows: from the spill database through this process's
  // SpillReader, and the rows it cannot find (newer than its view) or read
  // through the daemon. statuses[i] is OK, NotFound, or the transport error.
  void FetchSpilled(std::span<const uint64_t> ids, Row* const* rows, Status* statuses);
  // The same through the daemon alone, one round trip per batch.
  void FetchSpilledFromDaemon(std::span<const uint64_t> ids, Row* const* rows,
                              Status* statuses);
  Status PutRow(uint64_t id, std::span<const ColumnRef> columns, bool* inserted);
  // A row of `size` encoded bytes goes to disk: left for SpillRows
  // (tally->to_disk), or TooLarge when no spilled row may be that large.
  Status ToDisk(uint64_t id, size_t size, PutTally* tally);
  // Puts a batch's rows that go to disk: through the stage, and one by one
  // over the socket (SpillPut) when no stage can be had.
  void SpillRows(std::span<const SpillStage::Row> rows, Status* statuses, bool* inserted);
  Status SpillPut(uint64_t id, std::span<const ColumnRef> columns, size_t size,
                  bool* inserted);
  // layout::SpillingOn and SpillsNow of the cache's state.
  bool SpillingOn() const;
  bool SpillsNow() const;
  // TooLarge for a row no segment within the budget could hold: the
  // daemon need not be asked.
  Status CheckRowFits(uint64_t id, size_t size) const;
  // Fills *out from a located row (memory or disk), copying all columns or
  // only `columns` when project; counts the hit when count.
  Status Materialize(uint64_t id, uint64_t loc, std::span<const std::string_view> columns,
                     bool project, Row* out, bool count = true);

  std::shared_ptr<ClientImpl> client_;
  const uint32_t cache_id_;
  const uint32_t session_id_;
  ShmFile header_file_;
  layout::CacheHeader* header_ = nullptr;
  // This process's statistics line (re-picked in a forked child).
  std::atomic<uint32_t> stats_slot_{0};
  std::atomic<uint64_t> stats_fork_gen_{0};
  // This process's stats lane (nullptr: none) and the one thread counting
  // in it: a token, the address of that thread's thread_local.
  std::atomic<layout::StatsLane*> lane_{nullptr};
  std::atomic<const void*> lane_thread_{nullptr};
  std::atomic<bool> closed_{false};
  bool single_node_ = true;  // NUMA: every reader is on node 0

  // Mapping of tables and segments. tables_[i] and segments_ are written
  // under map_mu_ and read without it once published (num_tables_, and
  // SegmentMap's own atomics), so only the files are GUARDED_BY.
  ForkSafeMutex map_mu_{LockRank::kCacheMap};
  std::atomic<uint32_t> num_tables_{0};
  IndexTable tables_[layout::kMaxTables];
  ShmFile table_files_[layout::kMaxTables] GUARDED_BY(map_mu_);
  SegmentMap segments_;  // Insert() with map_mu_ held

  ForkSafeMutex put_mu_{LockRank::kCachePut};
  std::vector<Chunk> chunks_ GUARDED_BY(put_mu_);  // one per NUMA node
  uint64_t chunk_fork_gen_ GUARDED_BY(put_mu_) = 0;
  SpillStage stage_;  // rows to disk
};

}  // namespace shmcache
