// CacheImpl: one open cache in this process: its header mapped, and the
// parts that work on it: the index tables (TableSet), the data segments
// (SegmentSet), this process's counters (StatsLanes) and its chunks
// (ChunkWriter). CacheImpl itself decides where a row goes (memory, disk,
// nowhere) and reads rows back from either.
//
// Hot paths (Get, View, Contains) take no lock and make no system call once
// the segments they touch are mapped. Put takes the writer's process-local
// mutex (a killed process takes it with it; fork() waits until no thread
// holds it) and calls the daemon only to lease a new chunk or grow the index.
//
// Implemented in cache_impl.cc (attach, statistics, close), cache_read.cc,
// cache_put.cc and cache_spill.cc (the rows on disk: their puts go through
// the SpillStage, spill_stage.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "format/layout.h"
#include "format/shm_file.h"
#include "lib/batch_window.h"
#include "lib/chunk_writer.h"
#include "lib/client_impl.h"
#include "lib/segment_set.h"
#include "lib/spill_reader.h"
#include "lib/spill_stage.h"
#include "lib/stats_lanes.h"
#include "lib/table_set.h"
#include "shmcache/row.h"
#include "shmcache/stats.h"
#include "shmcache/types.h"

namespace shmcache {

class CacheImpl {
 public:
  static Status Attach(const std::shared_ptr<ClientImpl>& client, uint32_t cache_id,
                       uint32_t session_id, std::shared_ptr<CacheImpl>* out);
  ~CacheImpl();

  // A batch of one.
  Status Put(uint64_t id, std::span<const ColumnRef> columns, bool* inserted);
  Status PutBatch(std::span<const uint64_t> ids,
                  std::span<const std::span<const ColumnRef>> rows, Status* statuses,
                  bool* inserted);
  // The whole row (project false) or the named columns of row `id`.
  Status Get(uint64_t id, std::span<const std::string_view> columns, bool project,
             Row* out);
  // Get of the whole row: the hit path (FindInMemory) in line, everything
  // else in GetSlow. Cache::GetFull's body, and the projections' whole-row
  // case.
  Status GetWhole(uint64_t id, Row* out);
  // Cache::GetHit's body, the common hit of Cache::Get: copies row `id`
  // into *out, counts the hit and returns the copy's destination when the
  // row is in memory, in a mapped segment, through one index table, under
  // kLeafCopyBytes, *out's buffer holds it, and the calling thread counts
  // in the lane; nullptr, having done nothing, otherwise (GetWhole then
  // does it all). Its one call is the copy, last, as a tail call: it saves
  // and restores no register (docs/hit-path.md, "Nothing restored after
  // the copy"). View: its hit path in line, the rest in ViewSlow. Both
  // defined in cache_read.cc and always inlined there; not callable from
  // other files.
  inline const void* GetLeaf(uint64_t id, Row* out);
  inline Status View(uint64_t id, RowView* out);
  // count=false: GetBatchUncounted (cache.h).
  Status GetBatch(std::span<const uint64_t> ids, Row* rows, Status* statuses,
                  bool count = true);
  // count=false: ViewBatchUncounted (cache.h).
  Status ViewBatch(std::span<const uint64_t> ids, RowView* views, Status* statuses,
                   bool count = true);
  bool Contains(uint64_t id);
  Status GetStats(CacheStats* out);
  bool IsFull() const;
  uint64_t SpilledRowsDropped() const {
    return rows_dropped_.load(std::memory_order_relaxed);
  }
  void Close();

  uint32_t cache_id() const { return cache_id_; }
  uint32_t session_id() const { return session_id_; }
  // "cache 3 (session 7, 'name')", as the server's messages name it (its
  // name as the header holds it), for messages.
  std::string Label() const;
  // OK, or why the cache cannot be used: InvalidArgument once closed,
  // NotFound once its session was destroyed (cache.h).
  Status Usable() const;

 private:
  // `header_file` is the cache's header, checked.
  CacheImpl(std::shared_ptr<ClientImpl> client, uint32_t cache_id, uint32_t session_id,
            ShmFile header_file);
  // NotFound for a row that is not cached.
  static Status Miss(uint64_t id);
  // Whether the cache can be read and written: not closed, its session not
  // destroyed. Usable() says why not.
  bool usable() const {
    return !closed_.load(std::memory_order_relaxed) &&
           !(header_->state.load(std::memory_order_relaxed) & layout::kStateDestroyed);
  }

  // ---- reads (cache_read.cc) ----
  // Lookup for a read: the location, or NotFound (a counted miss), or why
  // the cache cannot be used.
  Status Locate(uint64_t id, uint64_t* loc);
  // Lookup of a batch with its memory misses overlapped: every id's index
  // slot is prefetched before any is probed, and every row's header before
  // any is read (PutBatch's lookup of a window).
  void LookupBatch(std::span<const uint64_t> ids, uint64_t* locs);
  // The batched reads' pipeline: how many ids ahead of the row being read
  // its index slot is prefetched (kSlotsAhead), and its slot probed and
  // its row header prefetched (kRowsAhead). The slot has had kSlotsAhead -
  // kRowsAhead rows' time to arrive when it is probed, the header
  // kRowsAhead rows' when it is read.
  static constexpr size_t kSlotsAhead = 48;
  static constexpr size_t kRowsAhead = 32;
  // Where the pipeline found a row: loc (kEmpty: absent) and, for a row in
  // memory whose segment this process has mapped, that mapping.
  struct Located {
    uint64_t loc;
    const MappedSegment* seg;  // nullptr: not in memory, or not mapped yet
  };
  // Calls row_fn(i, located) for each id, in order, through that pipeline,
  // with the index tables counted at the call's start. REQUIRES: the cache
  // usable. Defined in cache_read.cc, for its batches.
  template <typename RowFn>
  void ForEachLocated(std::span<const uint64_t> ids, RowFn&& row_fn);
  // What a batched read counts, once for the call; numa: whether hits are
  // told local or not (StatsLanes::LocalHit; never on a one-node host).
  struct BatchCounts {
    uint64_t hits = 0, local_hits = 0, misses = 0;
    bool numa = false;
  };
  // What a batch's located row is, counted in *counts: read in memory (the
  // row in *view, *status OK; a hit), absent (*status NotFound; a miss),
  // spilled (*status untouched, nothing counted), or an error (*status
  // says what: a segment that cannot be mapped, a location that is not
  // this id's row; nothing counted). Defined in cache_read.cc.
  enum class Found { kInMemory, kAbsent, kSpilled, kError };
  // TableSet::Lookup for a batch's miss, out of line: the batches' loops
  // keep their registers for hits.
  [[gnu::noinline, gnu::cold]] uint64_t LookAgain(uint64_t id);
  inline Found ReadLocated(uint64_t id, const Located& row, RowView* view, Status* status,
                           BatchCounts* counts);
  // ForEachLocated in the tables of `tables` (kOneTable: exactly one).
  template <bool kOneTable, typename RowFn>
  void PipelineRows(std::span<const uint64_t> ids, TableSet::Range tables,
                    RowFn&& row_fn);
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
  // Fills *out from a located row (memory or disk), copying all columns or
  // only `columns` when project; counts the hit when count.
  Status Materialize(uint64_t id, uint64_t loc, std::span<const std::string_view> columns,
                     bool project, Row* out, bool count = true);

  // ---- puts (cache_put.cc) ----
  // One row of a batch; `loc` is where the index had the id before the
  // batch (kEmpty: absent). Goes to memory (written here), to disk (left
  // for SpillRows: *disk_bytes is its encoded size, 0 for every other
  // row), or nowhere (Full).
  Status PutBatchRow(uint64_t id, std::span<const ColumnRef> columns, uint64_t loc,
                     ChunkWriter::BatchLock* lock, ChunkWriter::Tally* tally,
                     bool* inserted, size_t* disk_bytes);
  // Adds the rows and bytes `tally` holds to the statistics and empties it.
  void CountPuts(ChunkWriter::Tally* tally);
  // TooLarge for a row no segment within the budget could hold: the
  // daemon need not be asked.
  Status CheckRowFits(uint64_t id, size_t size) const;

  // ---- rows on disk (cache_spill.cc) ----
  // Reads spilled rows: from the spill database through this process's
  // SpillReader, and the rows it cannot find (newer than its view) or read
  // through the daemon. statuses[i] is OK, NotFound, or the transport error.
  void FetchSpilled(std::span<const uint64_t> ids, Row* const* rows, Status* statuses);
  // The mean encoded size of the cache's spilled rows, from the daemon's
  // totals in the header; 0 while none is counted. The reader's choice
  // between MultiGet and seeks (SpillReader::kSeekRowBytes) rests on it.
  size_t SpilledRowBytes() const;
  // The same through the daemon alone, one round trip per batch.
  void FetchSpilledFromDaemon(std::span<const uint64_t> ids, Row* const* rows,
                              Status* statuses);
  // A row of `size` encoded bytes goes to disk: OK with *disk_bytes = size
  // (the batch stages its rows for disk together once the rest are in:
  // SpillRows), or TooLarge when no spilled row may be that large.
  static Status ToDisk(uint64_t id, size_t size, size_t* disk_bytes);
  // Puts a batch's rows that go to disk: through the stage, and one by one
  // over the socket (SpillPut) when no stage can be had.
  void SpillRows(std::span<const SpillStage::Row> rows, Status* statuses, bool* inserted);
  // Sends one row to the daemon, which writes it to the spill store.
  Status SpillPut(uint64_t id, std::span<const ColumnRef> columns, size_t size,
                  bool* inserted);
  // layout::SpillingOn and SpillsNow of the cache's state.
  bool SpillingOn() const;
  bool SpillsNow() const;

  // Destroyed last: the parts below use its connection and paths.
  const std::shared_ptr<ClientImpl> client_;
  const uint32_t cache_id_;
  const uint32_t session_id_;
  const ShmFile header_file_;
  layout::CacheHeader* const header_;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> rows_dropped_{0};  // RowDropped answers (Get)
  TableSet tables_;
  SegmentSet segments_;
  StatsLanes stats_;
  ChunkWriter writer_;  // writes into segments_ and tables_, counts into stats_
  SpillStage stage_;    // rows to disk
  // Keeps the instance's spill reader open from this cache's first spilled
  // read until Close (the reader goes with the process's last such use).
  SpillReader::Use reader_use_;
};

}  // namespace shmcache
