// The write path: rows are encoded into a chunk this process leased from
// the daemon and published in the index; one lock and one statistics
// update per batch.

#include <algorithm>

#include <fmt/format.h>

#include "format/numa_topology.h"
#include "format/row_codec.h"
#include "lib/cache_impl.h"

namespace shmcache {

Status CacheImpl::LeaseChunk(int node, size_t need, Chunk* c) {
  protocol::LeaseChunkResponse lease;
  Status s = client_->Call(
      protocol::LeaseChunkRequest{.cache_id = cache_id_,
                                  .node = static_cast<uint32_t>(node),
                                  .need = need,
                                  .has_old = c->base != nullptr,  // its tail comes back
                                  .old_seg_no = c->seg_no,
                                  .old_offset = c->offset},
      &lease);
  // On failure the daemon kept nothing of the old chunk: it stays ours.
  if (!s.ok()) return s;
  *c = Chunk{};
  const uint32_t seg_no = lease.seg_no;
  const uint64_t offset = lease.offset, size = lease.size;
  const MappedSegment* seg;
  s = SegmentFor(seg_no, &seg);
  if (!s.ok()) return s;
  if (offset < layout::kSegmentHeaderSize || offset % layout::kCacheLine != 0 ||
      size < sizeof(layout::ChunkHeader) + need || offset + size > seg->size) {
    return Status::Corruption("leased chunk lies outside its segment");
  }
  auto* h = reinterpret_cast<layout::ChunkHeader*>(seg->base + offset);
  if (h->magic != layout::kChunkMagic || h->cache_id != cache_id_ || h->size != size) {
    return Status::Corruption("leased chunk header does not match");
  }
  // This process writes the whole chunk: map its pages now, 16 per fault
  // (the daemon allocated and cleared them). Readers map segments lazily
  // instead: a fault maps a 64 KB window.
  PopulateForWrite(seg->base + offset, size);
  c->seg_no = seg_no;
  c->offset = offset;
  c->base = seg->base + offset;
  c->size = size;
  c->used = h->used.load(std::memory_order_relaxed);
  c->header = h;
  return Status::OK();
}

Status CacheImpl::GrowIndex(uint32_t seen) {
  Status s = client_->Call(
      protocol::GrowIndexRequest{.cache_id = cache_id_, .seen_tables = seen});
  if (!s.ok()) return s;
  return MapNewTables();
}

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

Status CacheImpl::PutBatch(std::span<const uint64_t> ids,
                           std::span<const std::span<const ColumnRef>> rows,
                           Status* statuses, bool* inserted) {
  if (inserted) std::fill(inserted, inserted + ids.size(), false);
  Status s = Usable();
  if (!s.ok()) {
    std::fill(statuses, statuses + ids.size(), s);
    return s;
  }
  PutLock lock(put_mu_, std::defer_lock);
  PutTally tally;
  uint64_t locs[kBatchWindow];
  bool added = false;
  std::vector<SpillStage::Row> to_disk;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % kBatchWindow == 0) {
      LookupBatch(ids.subspan(i, std::min(kBatchWindow, ids.size() - i)), locs);
    }
    statuses[i] = PutRow(ids[i], rows[i], locs[i % kBatchWindow], &lock, &tally, &added);
    if (tally.to_disk) {
      tally.to_disk = false;
      to_disk.push_back({ids[i], rows[i], tally.disk_bytes, i});
      continue;
    }
    if (inserted) inserted[i] = added;
    if (EndsBatch(statuses[i])) {
      std::fill(statuses + i + 1, statuses + ids.size(), statuses[i]);
      if (statuses[i].IsFull()) {
        Stats()->puts_full.fetch_add(ids.size() - i, std::memory_order_relaxed);
      }
      break;
    }
  }
  if (tally.rows > 0) {
    layout::StatsSlot* slot = Stats();
    slot->rows.fetch_add(tally.rows, std::memory_order_relaxed);
    slot->bytes.fetch_add(tally.bytes, std::memory_order_relaxed);
  }
  if (!to_disk.empty()) {
    if (lock.owns_lock()) lock.unlock();  // disk writes hold no put lock
    SpillRows(to_disk, statuses, inserted);
  }
  return Status::OK();
}

void CacheImpl::LockForPut(PutLock* lock) {
  if (lock->owns_lock()) {
    put_mu_.AssertHeld();
    return;
  }
  lock->lock();
  put_mu_.AssertHeld();
  if (chunk_fork_gen_ != ForkGeneration()) {
    // The chunks belong to the parent process: never write into them.
    for (Chunk& c : chunks_) c = Chunk{};
    chunk_fork_gen_ = ForkGeneration();
  }
}

Status CacheImpl::PutRow(uint64_t id, std::span<const ColumnRef> columns, uint64_t loc,
                         PutLock* lock, PutTally* tally, bool* inserted) {
  *inserted = false;
  if (uint32_t state = header_->state.load(std::memory_order_relaxed);
      layout::IsFull(state)) {
    if (layout::FullByCap(state)) {
      return Status::FullServerCap(
          fmt::format("cache {} is full: the server's memory cap is used up", cache_id_));
    }
    return Status::Full(fmt::format("cache {} is full", cache_id_));
  }
  if (loc != layout::kEmpty) return Status::OK();
  size_t size;
  Status s = RowCodec::EncodedSize(columns, &size);
  if (!s.ok()) return s;
  if (SpillsNow()) return ToDisk(id, size, tally);
  s = CheckRowFits(id, size);
  if (!s.ok()) return SpillingOn() ? ToDisk(id, size, tally) : s;
  LockForPut(lock);
  return PutInMemory(id, columns, size, tally, inserted);
}

Status CacheImpl::PutInMemory(uint64_t id, std::span<const ColumnRef> columns,
                              size_t size, PutTally* tally, bool* inserted) {
  size_t node = static_cast<size_t>(NumaTopology::Get().CurrentNode()) % chunks_.size();
  Chunk& c = chunks_[node];
  Status s;
  if (c.base == nullptr || c.size - c.used < size) {
    s = LeaseChunk(static_cast<int>(node), size, &c);
    if (s.IsFull() && SpillsNow()) return ToDisk(id, size, tally);
    if (s.IsTooLarge()) {
      // Only this row: the cache goes on taking smaller ones in memory.
      if (SpillingOn()) return ToDisk(id, size, tally);
      return Status::TooLarge(fmt::format("row {}: {}", id, s.message()));
    }
    if (!s.ok()) return s;
  }
  // Reserve before writing: whatever lies past `used` may be re-leased by
  // the daemon if this process dies, so the row must be inside it first.
  uint64_t off = c.used;
  c.used += size;
  c.header->used.store(c.used, std::memory_order_relaxed);
  RowCodec::Encode(id, columns, reinterpret_cast<std::byte*>(c.base + off), size);
  uint64_t loc = layout::MakeLocation(c.seg_no, c.offset + off);
  for (;;) {
    uint32_t n = num_tables_.load(std::memory_order_acquire);
    IndexTable::InsertResult r = tables_[n - 1].Insert(id, loc);
    if (r == IndexTable::InsertResult::kInserted) {
      ++tally->rows;
      tally->bytes += size;
      *inserted = true;
      return Status::OK();
    }
    if (r == IndexTable::InsertResult::kExists) break;
    s = GrowIndex(n);
    if (!s.ok()) break;
  }
  // Not published: the space is still ours alone, take it back.
  c.used = off;
  c.header->used.store(off, std::memory_order_relaxed);
  return s;
}

Status CacheImpl::CheckRowFits(uint64_t id, size_t size) const {
  const uint64_t budget = header_->budget_bytes;
  if (size <= protocol::kMaxLeaseBytes &&
      layout::SegmentBytesFor(layout::ChunkBytesFor(size)) <= budget) {
    return Status::OK();
  }
  return Status::TooLarge(fmt::format(
      "row {} of {:.1f} MB needs more than cache {}'s whole memory budget of {} MB; "
      "it is not cached, smaller rows still are",
      id, static_cast<double>(size) / (1 << 20), cache_id_, budget >> 20));
}

void CacheImpl::ReturnChunksLocked() {
  if (chunk_fork_gen_ != ForkGeneration()) return;  // the parent's chunks
  for (Chunk& c : chunks_) {
    if (c.base == nullptr) continue;
    // The daemon reclaims the tail on disconnect anyway; the wait for the
    // answer is short (protocol::kReturnChunkTimeoutMs), and a lost
    // connection is not reopened for it.
    client_
        ->CallOnCurrentConnection(protocol::ReturnChunkRequest{
            .cache_id = cache_id_, .seg_no = c.seg_no, .offset = c.offset})
        .PermitUncheckedError();
    c = Chunk{};
  }
}

}  // namespace shmcache
