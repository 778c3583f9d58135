#include "lib/chunk_writer.h"

#include <algorithm>
#include <utility>

#include "format/numa_topology.h"
#include "format/row_codec.h"
#include "format/shm_file.h"

namespace shmcache {

ChunkWriter::ChunkWriter(std::shared_ptr<ClientImpl> client, uint32_t cache_id,
                         int num_nodes, SegmentSet* segments, TableSet* tables,
                         StatsLanes* stats)
    : client_(std::move(client)),
      cache_id_(cache_id),
      segments_(segments),
      tables_(tables),
      stats_(stats) {
  ForkSafeLock lock(&mu_);  // nobody else sees the writer yet; for the analysis
  chunks_.resize(static_cast<size_t>(num_nodes));
  fork_gen_ = ForkGeneration();
}

void ChunkWriter::Lock(BatchLock* lock) {
  if (lock->lock_.owns_lock()) {
    mu_.AssertHeld();
    return;
  }
  lock->asked_ = std::chrono::steady_clock::now();
  lock->lock_.lock();
  mu_.AssertHeld();
  if (fork_gen_ != ForkGeneration()) {
    // The chunks belong to the parent process: never write into them.
    for (Chunk& c : chunks_) c = Chunk{};
    fork_gen_ = ForkGeneration();
  }
}

Status ChunkWriter::Lease(int node, size_t need, Chunk* c) {
  protocol::LeaseChunkResponse lease;
  Status s = client_->Call(
      protocol::LeaseChunkRequest{.cache_id = cache_id_,
                                  .node = static_cast<uint32_t>(node),
                                  .need = need,
                                  .has_old = c->base != nullptr,  // its tail comes back
                                  .old_seg_no = c->seg_no,
                                  .old_offset = c->offset},
      &lease);
  if (!s.ok()) {
    // A refusal the daemon answered kept nothing of the old chunk: it stays
    // ours. No answer (Unavailable: a timeout, a broken connection) or one
    // that could not be read (Corruption) may hide a lease granted, and
    // with it the old chunk's tail taken back for the next writer: the old
    // chunk is never written again (what is lost is its tail's space).
    if (c->base != nullptr && (s.IsUnavailable() || s.IsCorruption())) *c = Chunk{};
    return s;
  }
  *c = Chunk{};
  const uint32_t seg_no = lease.seg_no;
  const uint64_t offset = lease.offset, size = lease.size;
  const MappedSegment* seg;
  s = segments_->Map(seg_no, &seg);
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
  // As the daemon formatted it; the mark may hold kRoomTaken already
  // (another writer's lease took the chunk's end): MoveUsed reads it.
  c->used = sizeof(layout::ChunkHeader);
  c->header = h;
  return Status::OK();
}

Status ChunkWriter::Write(uint64_t id, std::span<const ColumnRef> columns, size_t size,
                          BatchLock* lock, Tally* tally, bool* inserted,
                          bool* lease_failed, const Status* refusal) {
  *inserted = false;
  *lease_failed = false;
  Lock(lock);
  if (closed_) return Status::InvalidArgument("cache is closed");
  const size_t node =
      static_cast<size_t>(NumaTopology::Get().CurrentNode()) % chunks_.size();
  Chunk& c = chunks_[node];
  Status s;
  refused_ = refused_ && refusal != nullptr;
  // Reserve before writing: whatever lies past `used` may be re-leased by
  // the daemon if this process dies, or taken back for another writer.
  while (refused_ || c.base == nullptr || c.size - c.used < size ||
         !MoveUsed(&c, c.used + size)) {
    if (refusal != nullptr) {
      refused_ = true;
      *lease_failed = true;
      return *refusal;
    }
    if (unanswered_at_ > lock->asked_) {
      *lease_failed = true;
      return Status::Unavailable(
          "the cache server did not answer a lease asked by another thread while this "
          "one waited to put");
    }
    if (stats_ != nullptr && tally->rows > 0) {
      stats_->CountPuts(tally->rows, tally->bytes);
      *tally = {};
    }
    s = Lease(static_cast<int>(node), size, &c);
    if (!s.ok()) {
      if (s.IsUnavailable()) unanswered_at_ = std::chrono::steady_clock::now();
      // A row refused for want of a chunk is a refusal too: full stays
      // full for this writer (the chunk's room is not used after it).
      if (s.IsFull()) refused_ = true;
      *lease_failed = true;
      return s;
    }
  }
  const uint64_t off = c.used - size;
  RowCodec::Encode(id, columns, reinterpret_cast<std::byte*>(c.base + off), size);
  const uint64_t loc = layout::MakeLocation(c.seg_no, c.offset + off);
  for (;;) {
    uint32_t tables = 0;
    IndexTable::InsertResult r = tables_->InsertNewest(id, loc, &tables);
    if (r == IndexTable::InsertResult::kInserted) {
      ++tally->rows;
      tally->bytes += size;
      *inserted = true;
      return Status::OK();
    }
    if (r == IndexTable::InsertResult::kExists) break;
    s = GrowIndex(tables);
    if (!s.ok()) break;
  }
  // Not published: the space is still ours alone, take it back.
  MoveUsed(&c, off);
  return s;
}

bool ChunkWriter::MoveUsed(Chunk* c, uint64_t to) {
  std::atomic<uint64_t>& mark = c->header->used;
  uint64_t seen = c->used;
  for (;;) {
    if (seen & layout::kRoomTaken) {
      // The daemon took the chunk's end back for another writer: the chunk
      // ends where it says, and the mark is this process's again (unless
      // the daemon took more meanwhile: then that is read).
      c->size = std::min(c->size, seen & ~layout::kRoomTaken);
      if (!mark.compare_exchange_strong(seen, c->used, std::memory_order_relaxed))
        continue;
      seen = c->used;
    } else if (seen != c->used) {
      // Only this process and the daemon write the mark: never write here
      // again.
      c->size = c->used;
      return false;
    }
    if (to > c->size) return false;
    if (mark.compare_exchange_strong(seen, to, std::memory_order_relaxed)) {
      c->used = to;
      return true;
    }
  }
}

Status ChunkWriter::GrowIndex(uint32_t seen) {
  Status s = client_->Call(
      protocol::GrowIndexRequest{.cache_id = cache_id_, .seen_tables = seen});
  if (!s.ok()) return s;
  return tables_->MapNew();
}

void ChunkWriter::ReturnChunks() {
  ForkSafeLock lock(&mu_);
  closed_ = true;
  if (fork_gen_ != ForkGeneration()) return;  // the parent's chunks
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
