// Chunks: leased to a connection, given back, and the unused tails of a
// finished connection's chunks recycled into new ones.
#include "cache_state.h"

#include <algorithm>

#include <fmt/format.h>

namespace shmcache {

layout::ChunkHeader* CacheState::ChunkAt(uint32_t seg_no, uint64_t offset,
                                         uint64_t size) {
  auto* h =
      reinterpret_cast<layout::ChunkHeader*>(segments_.at(seg_no).file.data() + offset);
  h->cache_id = cache_id_;
  h->size = size;
  h->used.store(sizeof(layout::ChunkHeader));
  h->magic = layout::kChunkMagic;
  return h;
}

Status CacheState::Lease(uint64_t conn, int node, uint64_t need, MemoryAccount* account,
                         ChunkLease* out, bool* wait) {
  if (wait != nullptr) *wait = false;
  if (destroyed_) return Status::NotFound("cache was destroyed");
  if (uint32_t state = header_->state.load();
      state & (layout::kStateFull | layout::kStateMemFull)) {
    std::string msg = fmt::format("cache {} memory is full", cache_id_);
    if (layout::FullByCap(state)) return Status::FullServerCap(msg);
    return Status::Full(msg);
  }
  node = (node % num_nodes_ + num_nodes_) % num_nodes_;
  const uint64_t want = layout::ChunkBytesFor(need);
  auto& tails = tails_[static_cast<size_t>(node)];
  for (size_t i = 0; i < tails.size(); ++i) {
    if (tails[i].size >= want) {
      Tail t = tails[i];
      tails.erase(tails.begin() + static_cast<long>(i));
      ChunkAt(t.seg_no, t.offset, t.size);
      *out = ChunkLease{t.seg_no, t.offset, t.size};
      leases_[conn].push_back(*out);
      return Status::OK();
    }
  }
  Segment* seg = nullptr;
  int cur = current_[static_cast<size_t>(node)];
  if (cur >= 0 && segments_.at(static_cast<uint32_t>(cur)).size -
                          segments_.at(static_cast<uint32_t>(cur)).carved >=
                      want) {
    seg = &segments_.at(static_cast<uint32_t>(cur));
  } else {
    Status s = NewSegment(node, want, account, &seg, wait);
    if (!s.ok() || (wait != nullptr && *wait)) return s;
  }
  uint64_t avail = seg->size - seg->carved;
  uint64_t size = std::min(avail, std::max(want, kChunkBytes));
  if (avail - size < kMinRecycleBytes) size = avail;  // no sliver left over
  size = size / layout::kCacheLine * layout::kCacheLine;
  uint64_t offset = seg->carved;
  ChunkAt(seg->seg_no, offset, size);
  seg->carved += size;
  reinterpret_cast<layout::SegmentHeader*>(seg->file.data())->carved.store(seg->carved);
  *out = ChunkLease{seg->seg_no, offset, size};
  leases_[conn].push_back(*out);
  return Status::OK();
}

void CacheState::Return(uint64_t conn, uint32_t seg_no, uint64_t offset) {
  auto it = leases_.find(conn);
  if (it == leases_.end() || destroyed_) return;
  auto& v = it->second;
  auto l = std::find_if(v.begin(), v.end(), [&](const ChunkLease& c) {
    return c.seg_no == seg_no && c.offset == offset;
  });
  if (l == v.end()) return;  // not this connection's: ignore
  ChunkLease lease = *l;
  v.erase(l);
  auto* h = reinterpret_cast<layout::ChunkHeader*>(
      segments_.at(lease.seg_no).file.data() + lease.offset);
  // `used` was written by the client: trust it only within the chunk.
  uint64_t used = h->used.load();
  if (used < sizeof(layout::ChunkHeader) || used > lease.size) used = lease.size;
  uint64_t tail_off = AlignUp(lease.offset + used, layout::kCacheLine);
  uint64_t end = lease.offset + lease.size;
  if (tail_off + kMinRecycleBytes <= end) {
    const Segment& seg = segments_.at(lease.seg_no);
    tails_[static_cast<size_t>(seg.node)].push_back(
        Tail{lease.seg_no, tail_off, end - tail_off});
  }
}

void CacheState::ReleaseConnection(uint64_t conn, bool recycle) {
  auto it = leases_.find(conn);
  if (it == leases_.end()) return;
  std::vector<ChunkLease> held = it->second;
  if (recycle) {
    for (const ChunkLease& l : held) Return(conn, l.seg_no, l.offset);
  }
  leases_.erase(conn);
}

}  // namespace shmcache
