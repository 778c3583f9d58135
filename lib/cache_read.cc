// The read path: Get, View and their batches. Batches look ids up in a
// pipeline that keeps index slots and row headers loading ahead of the row
// being read.

#include "shmcache/cache.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "format/row_codec.h"
#include "lib/cache_impl.h"

namespace shmcache {

Status CacheImpl::Miss(uint64_t id) {
  return Status::NotFound(fmt::format("row {} is not cached", id));
}

Status CacheImpl::Materialize(uint64_t id, uint64_t loc,
                              std::span<const std::string_view> columns, bool project,
                              Row* out, bool count) {
  if (loc & layout::kSpilledBit) {
    Row* target = out;
    Row disk_row;
    if (project) target = &disk_row;
    Status s;
    FetchSpilled(std::span(&id, 1), &target, &s);
    if (s.IsNotFound() && count) stats_.CountRead(false, 0);
    if (!s.ok()) return s;
    if (project) s = RowCodec::Project(disk_row.view(), columns, out);
    if (s.ok() && count) stats_.CountRead(true, -1);
    return s;
  }
  RowView v;
  int node = 0;
  Status s = segments_.Resolve(id, loc, &v, &node);
  if (!s.ok()) return s;
  if (project) {
    s = RowCodec::Project(v, columns, out);
    if (!s.ok()) return s;
  } else {
    RowCodec::Copy(v, out);
  }
  if (count) stats_.CountRead(true, node);
  return Status::OK();
}

uint64_t CacheImpl::LookAgain(uint64_t id) { return tables_.Lookup(id); }

Status CacheImpl::Locate(uint64_t id, uint64_t* loc) {
  Status s = Usable();
  if (!s.ok()) return s;
  *loc = tables_.Lookup(id);
  if (*loc == layout::kEmpty) {
    stats_.CountRead(false, 0);
    return Miss(id);
  }
  return Status::OK();
}

// Always inlined into Get and View: see TableSet::Lookup.
[[gnu::always_inline]] inline bool CacheImpl::FindInMemory(uint64_t id, RowView* view,
                                                           int* node) {
  if (!usable()) return false;
  const uint64_t loc = tables_.LookupMapped(id);
  if (loc <= layout::kRetired || (loc & layout::kSpilledBit)) return false;
  return segments_.ReadRow(id, loc, view, node) == SegmentSet::RowCheck::kOk;
}

// Rows under this many bytes are copied on Get's leaf path (GetLeaf).
// glibc's memcpy copies larger ones with `rep movsb`, and there a Get that
// restores registers after the copy measured as fast as a View followed by
// the caller's memcpy (docs/hit-path.md): they keep GetWhole.
constexpr size_t kLeafCopyBytes = 2048;

// Lines of a row after its first that a single Get prefetches (7: 3 lines
// gained nothing at 3 KB rows).
constexpr size_t kRowLinesAhead = 7;

[[gnu::always_inline]] inline const void* CacheImpl::GetLeaf(uint64_t id, Row* out) {
  // One index table only: the lookup over several needs registers the
  // caller's would have to be saved for.
  const IndexTable* table = tables_.LoneMapped();
  if (table == nullptr || !usable()) [[unlikely]] {
    return nullptr;
  }
  const uint64_t loc = table->Find(id);
  if (loc <= layout::kRetired || (loc & layout::kSpilledBit)) [[unlikely]] {
    return nullptr;
  }
  int node = 0;
  RowView v;
  if (segments_.ReadRow(id, loc, &v, &node) != SegmentSet::RowCheck::kOk) [[unlikely]] {
    return nullptr;
  }
  const size_t n = v.bytes_.size();
  if (n >= kLeafCopyBytes || out->buf_.size() * sizeof(uint64_t) < n) [[unlikely]] {
    return nullptr;
  }
  // Nothing counted before this point: a hit that stops here is read
  // again, and counted, by GetWhole.
  const char* row = reinterpret_cast<const char*>(v.bytes_.data());
  for (size_t k = 1; k <= kRowLinesAhead; ++k) __builtin_prefetch(row + 64 * k);
  if (!stats_.CountHitInLane()) [[unlikely]] {
    return nullptr;
  }
  std::byte* dst = reinterpret_cast<std::byte*>(out->buf_.data());
  out->view_.bytes_ = std::span<const std::byte>(dst, n);
  out->view_.num_columns_ = v.num_columns_;
  out->view_.in_shared_memory_ = false;
  // Last, as a tail call: nothing of this function is restored after it.
  return std::memcpy(dst, v.bytes_.data(), n);
}

Status CacheImpl::GetWhole(uint64_t id, Row* out) {
  int node = 0;
  RowView v;
  if (FindInMemory(id, &v, &node)) [[likely]] {
    // The row's next lines start loading now, beside its header's: the
    // copy waits for the header (the row's length is in it), and this
    // overlaps the first lines' misses with the header's. Speculated ahead
    // of the checks, which still decide what is copied: a prefetch reads
    // nothing into the row and never faults. 3 KB rows: Get 1.07x; 1 KB:
    // no change beyond the noise (docs/hit-path.md).
    const char* row = reinterpret_cast<const char*>(v.encoded().data());
    for (size_t k = 1; k <= kRowLinesAhead; ++k) __builtin_prefetch(row + 64 * k);
    // Counted before the copy, which cannot fail: nothing of the count is
    // live across the copy's call.
    stats_.CountHit(node);
    RowCodec::Copy(v, out);
    return Status::OK();
  }
  return GetSlow(id, {}, false, out);
}

Status CacheImpl::Get(uint64_t id, std::span<const std::string_view> columns,
                      bool project, Row* out) {
  if (project) return GetSlow(id, columns, true, out);
  return GetWhole(id, out);
}

Status CacheImpl::GetSlow(uint64_t id, std::span<const std::string_view> columns,
                          bool project, Row* out) {
  uint64_t loc;
  Status s = Locate(id, &loc);
  if (s.ok()) s = Materialize(id, loc, columns, project, out);
  // A failed spill read may have refilled the buffer under the old view.
  if (!s.ok()) out->view_ = RowView();
  return s;
}

void CacheImpl::LookupBatch(std::span<const uint64_t> ids, uint64_t* locs) {
  const TableSet::Range tables = tables_.CurrentRange();
  for (uint64_t id : ids) tables_.Prefetch(id, tables);
  // Each probe re-reads the tables to probe (a table the daemon adds
  // during the window is probed too) but does not prefetch again.
  for (size_t i = 0; i < ids.size(); ++i) {
    locs[i] = tables_.FindIn(ids[i], tables_.CurrentRange());
    if (locs[i] == layout::kEmpty || (locs[i] & layout::kSpilledBit)) continue;
    segments_.Prefetch(locs[i]);
  }
}

template <bool kOneTable, typename RowFn>
void CacheImpl::PipelineRows(std::span<const uint64_t> ids, TableSet::Range tables,
                             RowFn&& row_fn) {
  // One table: the probes and prefetches lose their loop over tables. A
  // copy of its handle (the table stays mapped while tables_ lives): its
  // fields stay in registers across row_fn's stores.
  const IndexTable one = tables_.table(tables.first);
  auto find = [&](uint64_t id) __attribute__((always_inline)) {
    if constexpr (kOneTable) return one.Find(id);
    return tables_.FindIn(id, tables);
  };
  auto prefetch = [&](uint64_t id) __attribute__((always_inline)) {
    if constexpr (kOneTable) {
      one.Prefetch(id);
    } else {
      tables_.Prefetch(id, tables);
    }
  };
  // While row i is handed to row_fn, the index slot of id i + kSlotsAhead
  // and the header of row i + kRowsAhead are on their way, so the batch's
  // memory misses overlap from its first row to its last
  // (docs/hit-path.md, "ViewBatch as a pipeline"). The probe finds the
  // row's segment for the read as well.
  auto locate = [&](uint64_t id) {
    Located a{find(id), nullptr};
    if (a.loc != layout::kEmpty && !(a.loc & layout::kSpilledBit)) {
      a.seg = segments_.PrefetchRow(a.loc);
    }
    return a;
  };
  const size_t m = ids.size();
  for (size_t j = 0; j < std::min(m, kSlotsAhead); ++j) prefetch(ids[j]);
  Located ahead[kRowsAhead];  // ahead[j % kRowsAhead]: row j's
  static_assert((kRowsAhead & (kRowsAhead - 1)) == 0, "a ring of a power of two");
  for (size_t j = 0; j < std::min(m, kRowsAhead); ++j) ahead[j] = locate(ids[j]);
  for (size_t i = 0; i < m; ++i) {
    if (i + kSlotsAhead < m) prefetch(ids[i + kSlotsAhead]);
    const Located row = ahead[i % kRowsAhead];
    if (i + kRowsAhead < m) ahead[i % kRowsAhead] = locate(ids[i + kRowsAhead]);
    row_fn(i, row);
  }
}

template <typename RowFn>
void CacheImpl::ForEachLocated(std::span<const uint64_t> ids, RowFn&& row_fn) {
  // The tables to probe are read once, for the whole call: every row
  // published before the call is in one of them (a writer publishes only
  // in a table the header counted first, and again in a newer one that the
  // daemon made meanwhile), and a row published during the call may be
  // missed as it may be by any read that starts earlier. A compaction
  // during the call may free those tables: a miss is looked up again
  // (ReadLocated's LookAgain, through TableSet::LookupFrom).
  const TableSet::Range tables = tables_.CurrentRange();
  if (tables.end - tables.first == 1) [[likely]] {
    PipelineRows<true>(ids, tables, row_fn);
  } else {
    PipelineRows<false>(ids, tables, row_fn);
  }
}

// Always inlined into the batches' loops, the read in memory first.
[[gnu::always_inline]] inline CacheImpl::Found CacheImpl::ReadLocated(
    uint64_t id, const Located& row, RowView* view, Status* status, BatchCounts* counts) {
  int node = 0;
  if (row.seg != nullptr && SegmentSet::ReadRowIn(row.seg, id, row.loc, view, &node) ==
                                SegmentSet::RowCheck::kOk) [[likely]] {
    *status = Status::OK();
  } else {
    uint64_t loc = row.loc;
    // A miss in the tables the call began with: looked up again in the
    // tables as they are now (a compaction into a table added since may
    // have moved the row out of those; TableSet).
    if (loc == layout::kEmpty) loc = LookAgain(id);
    if (loc == layout::kEmpty) {
      ++counts->misses;
      *status = Miss(id);
      return Found::kAbsent;
    }
    if (loc & layout::kSpilledBit) return Found::kSpilled;
    // Its segment not mapped yet (Resolve maps it), or a bad location
    // (Resolve says what is wrong).
    *status = segments_.Resolve(id, loc, view, &node);
    if (!status->ok()) return Found::kError;
  }
  ++counts->hits;
  if (counts->numa && stats_.LocalHit(node)) ++counts->local_hits;
  return Found::kInMemory;
}

Status CacheImpl::ViewBatch(std::span<const uint64_t> ids, RowView* views,
                            Status* statuses, bool count) {
  // One id in memory (the Python package's per-sample read): View's hit
  // path; a pipeline has nothing to overlap.
  int node = 0;
  if (ids.size() == 1 && FindInMemory(ids[0], views, &node)) [[likely]] {
    if (count) stats_.CountHit(node);
    statuses[0] = Status::OK();
    return Status::OK();
  }
  Status s = Usable();
  if (!s.ok()) {
    std::fill(statuses, statuses + ids.size(), s);
    std::fill(views, views + ids.size(), RowView());
    return s;
  }
  // Counted once for the call (StatsLanes::CountReads): the batch's other
  // copy threads count beside this one.
  BatchCounts counts{.numa = !stats_.single_node()};
  ForEachLocated(
      ids, [&](size_t i, const Located& row) __attribute__((always_inline)) {
        const Found found = ReadLocated(ids[i], row, &views[i], &statuses[i], &counts);
        if (found == Found::kInMemory) [[likely]]
          return;
        if (found == Found::kSpilled) {
          statuses[i] = Status::NotSupported(
              "a spilled row has no shared memory to view; use GetBatch");
        }
        views[i] = RowView();
      });
  if (count) stats_.CountReads(counts.hits, counts.local_hits, counts.misses);
  return Status::OK();
}

Status CacheImpl::GetBatch(std::span<const uint64_t> ids, Row* rows, Status* statuses,
                           bool count) {
  Status s = Usable();
  if (!s.ok()) {
    std::fill(statuses, statuses + ids.size(), s);
    for (size_t i = 0; i < ids.size(); ++i) rows[i].view_ = RowView();
    return s;
  }
  std::vector<uint64_t> spilled;
  std::vector<Row*> targets;
  std::vector<size_t> where;
  // Counted once for the call (StatsLanes::CountReads), as ViewBatch does.
  BatchCounts counts{.numa = !stats_.single_node()};
  ForEachLocated(
      ids, [&](size_t i, const Located& row) __attribute__((always_inline)) {
        RowView v;
        const Found found = ReadLocated(ids[i], row, &v, &statuses[i], &counts);
        if (found == Found::kInMemory) [[likely]] {
          RowCodec::Copy(v, &rows[i], ids.size());
          return;
        }
        if (found == Found::kSpilled) {
          if (spilled.empty()) {  // room for the rest of the batch: grown once
            spilled.reserve(ids.size() - i);
            targets.reserve(ids.size() - i);
            where.reserve(ids.size() - i);
          }
          spilled.push_back(ids[i]);
          targets.push_back(&rows[i]);
          where.push_back(i);
          return;  // read below, with the batch's other spilled rows
        }
        rows[i].view_ = RowView();
      });
  if (!spilled.empty()) {
    std::vector<Status> got(spilled.size());
    FetchSpilled(spilled, targets.data(), got.data());
    for (size_t k = 0; k < spilled.size(); ++k) {
      if (got[k].ok()) {
        ++counts.hits;
      } else {
        if (got[k].IsNotFound()) ++counts.misses;  // absent, or dropped (RowDropped)
        rows[where[k]].view_ = RowView();
      }
      statuses[where[k]] = std::move(got[k]);
    }
  }
  if (count) stats_.CountReads(counts.hits, counts.local_hits, counts.misses);
  return Status::OK();
}

[[gnu::always_inline]] inline Status CacheImpl::View(uint64_t id, RowView* out) {
  int node = 0;
  if (FindInMemory(id, out, &node)) [[likely]] {
    stats_.CountHit(node);
    return Status::OK();
  }
  return ViewSlow(id, out);
}

Status CacheImpl::ViewSlow(uint64_t id, RowView* out) {
  uint64_t loc;
  Status s = Locate(id, &loc);
  if (s.ok() && (loc & layout::kSpilledBit)) {
    // A disk row has no shared memory to point into: the view points into
    // this thread's buffer, valid until the thread's next View of a disk row.
    static thread_local Row disk_row;
    s = Materialize(id, loc, {}, false, &disk_row);
    if (s.ok()) *out = disk_row.view();
  } else if (s.ok()) {
    int node = 0;
    s = segments_.Resolve(id, loc, out, &node);
    if (s.ok()) stats_.CountRead(true, node);
  }
  if (!s.ok()) *out = RowView();
  return s;
}

bool CacheImpl::Contains(uint64_t id) {
  return usable() && tables_.Lookup(id) != layout::kEmpty;
}

// Cache's single-row reads live here rather than in cache.cc so that the
// hit path compiles into them: one call from the caller to the copy.
const void* Cache::GetHit(uint64_t id, Row* out) { return impl_->GetLeaf(id, out); }
Status Cache::GetFull(uint64_t id, Row* out) { return impl_->GetWhole(id, out); }
Status Cache::View(uint64_t id, RowView* out) { return impl_->View(id, out); }

}  // namespace shmcache
