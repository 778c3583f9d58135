// The write path: where each row of a batch goes (memory through the
// ChunkWriter, disk through the SpillStage once the batch's memory rows are
// in, or nowhere when the cache is full); one lock per batch, and the rows
// counted once per window of the batch.

#include <algorithm>

#include <fmt/format.h>

#include "format/row_codec.h"
#include "lib/cache_impl.h"

namespace shmcache {

Status CacheImpl::Put(uint64_t id, std::span<const ColumnRef> columns, bool* inserted) {
  Status status;
  bool added = false;
  PutBatch(std::span(&id, 1), std::span(&columns, 1), &status, &added)
      .PermitUncheckedError();  // an unusable cache is in `status` too
  if (inserted) *inserted = added;
  return status;
}

// A row that meets one of these ends its batch: the cache takes no more.
static bool EndsBatch(const Status& s) { return s.IsFull() || s.IsUnavailable(); }

// Counts the rows published since the last call. PutBatch counts once per
// window of kBatchWindow rows, not once per batch: a writer killed in the
// middle of a batch leaves at most one window's rows uncounted. Not once per
// row: two atomic adds to a line of shared memory for each row (a line
// another process can share: slots are picked by pid) on the path whose
// scaling across writer processes issue 36 measures.
void CacheImpl::CountPuts(ChunkWriter::Tally* tally) {
  if (tally->rows == 0) return;
  stats_.CountPuts(tally->rows, tally->bytes);
  *tally = {};
}

Status CacheImpl::PutBatch(std::span<const uint64_t> ids,
                           std::span<const std::span<const ColumnRef>> rows,
                           Status* statuses, bool* inserted) {
  if (inserted) std::fill(inserted, inserted + ids.size(), false);
  Status s = Usable();
  if (!s.ok()) {
    std::fill(statuses, statuses + ids.size(), s);
    return s;
  }
  ChunkWriter::BatchLock lock(&writer_, ids.size(), statuses, inserted);
  ChunkWriter::Tally tally;
  uint64_t locs[kBatchWindow];
  bool added = false;
  std::vector<SpillStage::Row> to_disk;
  // The first row not stored for a status that ends the batch.
  size_t end = ids.size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % kBatchWindow == 0) {
      // The window's rows written through a descriptor are published
      // before the next window's ids are looked up.
      if (!writer_.Publish(&lock, &tally)) break;
      LookupBatch(ids.subspan(i, std::min(kBatchWindow, ids.size() - i)), locs);
      CountPuts(&tally);
    }
    lock.AtRow(i);
    size_t disk_bytes = 0;
    statuses[i] = PutBatchRow(ids[i], rows[i], locs[i % kBatchWindow], &lock, &tally,
                              &added, &disk_bytes);
    if (disk_bytes > 0) {
      to_disk.push_back({ids[i], rows[i], disk_bytes, i});
      continue;
    }
    if (inserted) inserted[i] = added;
    if (EndsBatch(statuses[i])) {
      end = i;
      break;
    }
  }
  writer_.Publish(&lock, &tally);
  if (lock.ended() && lock.ended_at() < end) end = lock.ended_at();
  if (end < ids.size()) {
    // A queued row's failure ends the batch where it stood: the rows after
    // it, queued or not, are not stored either.
    const Status ending = statuses[end];
    std::fill(statuses + end, statuses + ids.size(), ending);
    if (inserted != nullptr) std::fill(inserted + end, inserted + ids.size(), false);
    std::erase_if(to_disk, [end](const SpillStage::Row& r) { return r.index >= end; });
    if (ending.IsFull()) stats_.CountPutsFull(ids.size() - end);
  }
  CountPuts(&tally);
  if (!to_disk.empty()) {
    lock.Unlock();  // disk writes hold no put lock
    SpillRows(to_disk, statuses, inserted);
  }
  return Status::OK();
}

Status CacheImpl::PutBatchRow(uint64_t id, std::span<const ColumnRef> columns,
                              uint64_t loc, ChunkWriter::BatchLock* lock,
                              ChunkWriter::Tally* tally, bool* inserted,
                              size_t* disk_bytes) {
  *inserted = false;
  *disk_bytes = 0;
  // Cached already: the first writer won (cache.h), full cache or not; no
  // refusal, so it ends no batch and counts in no puts_full.
  if (loc != layout::kEmpty) return Status::OK();
  Status full;  // why a full cache refuses the row; OK while it is not full
  if (uint32_t state = header_->state.load(std::memory_order_relaxed);
      layout::IsFull(state)) {
    full = layout::FullByCap(state)
               ? Status::FullServerCap(fmt::format(
                     "{} is full: the server's memory cap is used up", Label()))
               : Status::Full(fmt::format("{} is full", Label()));
  }
  size_t size;
  Status s = RowCodec::EncodedSize(columns, &size);
  if (!s.ok()) return s;
  if (!full.ok()) {
    // The flag stops new leases, not rows into the chunk this process
    // holds: the lease of another writer (a DataLoader worker beside this
    // one) that found the budget used up marks the cache full while this
    // chunk may have room for many rows. No round trip either way.
    bool lease_failed = false;
    return writer_.Write(id, columns, size, lock, tally, inserted, &lease_failed, &full);
  }
  if (SpillsNow()) return ToDisk(id, size, disk_bytes);
  s = CheckRowFits(id, size);
  if (!s.ok()) return SpillingOn() ? ToDisk(id, size, disk_bytes) : s;
  bool lease_failed = false;
  s = writer_.Write(id, columns, size, lock, tally, inserted, &lease_failed);
  if (s.ok() || !lease_failed) return s;
  if (s.IsFull() && SpillsNow()) return ToDisk(id, size, disk_bytes);
  if (s.IsTooLarge()) {
    // Only this row: the cache goes on taking smaller ones in memory.
    if (SpillingOn()) return ToDisk(id, size, disk_bytes);
    return Status::TooLarge(fmt::format("row {}: {}", id, s.message()));
  }
  return s;
}

Status CacheImpl::CheckRowFits(uint64_t id, size_t size) const {
  const uint64_t budget = header_->budget_bytes.load(std::memory_order_relaxed);
  if (size <= protocol::kMaxLeaseBytes &&
      layout::SegmentBytesFor(layout::ChunkBytesFor(size)) <= budget) {
    return Status::OK();
  }
  return Status::TooLarge(fmt::format(
      "row {} of {:.1f} MB needs more than the whole memory budget of {} MB of {}; "
      "it is not cached, smaller rows still are; to cache rows this large, open the "
      "cache with a larger size_mb",
      id, static_cast<double>(size) / (1 << 20), budget >> 20, Label()));
}

}  // namespace shmcache
