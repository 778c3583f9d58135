// One cache's row memory: segments (sized, created, formatted, adopted,
// prepared ahead of need), chunks leased from them and tails recycled, and
// the budget and cap that bound them.
#include "daemon/segment_allocator.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "common/size_text.h"
#include "daemon/logger.h"
#include "daemon/shm_pages.h"
#include "format/align.h"
#include "format/cache_stats.h"

namespace shmcache {

namespace {
// Names tried before giving up when another user took them: segment
// numbers are skipped in order, and the next call goes on past them.
constexpr uint32_t kSegmentNameTries = 1024;

// A refused row's size and the most a row can take (less), said so that
// the row never reads as no larger: in KB, else in bytes, where the two
// round to the same text.
std::pair<std::string, std::string> RowAndMost(uint64_t row, uint64_t most) {
  std::pair<std::string, std::string> said{SizeText(row), SizeText(most)};
  if (said.first != said.second) return said;
  if ((row + 1023) / 1024 > most / 1024) {
    return {fmt::format("{} KB", (row + 1023) / 1024), fmt::format("{} KB", most / 1024)};
  }
  return {fmt::format("{} bytes", row), fmt::format("{} bytes", most)};
}

// if/return, not ?: (clang-analyzer reads a Status out of ?: as a leak).
Status FullStatus(const std::string& msg, bool by_cap) {
  if (by_cap) return Status::FullServerCap(msg);
  return Status::Full(msg);
}

constexpr uint64_t kPageBytes = 4096;

// Pages are supplied in whole 2 MB pages (huge pages where the shm dir has
// them), up to the segment's end.
uint64_t SupplyEnd(uint64_t end, uint64_t seg_size) {
  return std::min(seg_size, AlignUp(end, kHugePageBytes));
}
}  // namespace

SegmentAllocator::SegmentAllocator(const InstancePaths& paths, uint32_t cache_id,
                                   int num_nodes, Logger* log)
    : paths_(paths),
      log_(log),
      cache_id_(cache_id),
      num_nodes_(num_nodes),
      prepared_(static_cast<size_t>(num_nodes)),
      preparing_(static_cast<size_t>(num_nodes), 0),
      parallel_(static_cast<size_t>(num_nodes), 1),
      batch_bytes_(static_cast<size_t>(num_nodes), 0),
      current_(static_cast<size_t>(num_nodes), -1),
      open_(static_cast<size_t>(num_nodes)),
      tails_(static_cast<size_t>(num_nodes)) {}

void SegmentAllocator::Attach(layout::CacheHeader* header, const std::string& label,
                              uint64_t budget_bytes) {
  header_ = header;
  label_ = label;
  budget_bytes_ = budget_bytes;
}

std::string SegmentAllocator::Label() const {
  return label_.empty() ? fmt::format("cache {}", cache_id_) : label_;
}

uint64_t SegmentAllocator::Release(std::vector<HeldFile>* held) {
  if (released_) return 0;
  released_ = true;
  uint64_t kept = 0;
  for (const auto& [seg_no, seg] : segments_) {
    kept += UnlinkHeldFile(paths_.SegmentFile(cache_id_, seg_no), seg.size, held);
  }
  for (auto& node : prepared_) {
    for (const Prepared& p : node) {
      kept += UnlinkHeldFile(paths_.SegmentFile(cache_id_, p.seg_no), p.size, held);
    }
    node.clear();
  }
  segments_.clear();
  for (auto& node : open_) node.clear();
  leases_.clear();
  data_bytes_ = 0;
  header_ = nullptr;
  return kept;
}

void SegmentAllocator::MarkFull(const std::string& why) {
  uint32_t old = header_->state.fetch_or(layout::kStateFull);
  if (old & layout::kStateFull || !log_) return;
  // Room given back may make it take rows again for a while (TakeRowsAgain):
  // the warning is said once.
  if (full_said_) {
    log_->Info("{} is full again: {}", label_, why);
  } else {
    log_->Warn("{} is full: {}; further rows are not cached", label_, why);
  }
  full_said_ = true;
}

bool SegmentAllocator::TakeRowsAgain(const std::string& why) {
  const uint32_t state = header_->state.load();
  // A cache whose memory is used up while it spills sends its rows to
  // disk. One whose spilling stopped since (full, kStateMemFull kept)
  // takes them in memory again, as any cache: its spilled rows are found
  // by their slots, and by the rows counted on disk where they have to be
  // dropped (CacheState::DropSpilledRows).
  if (!(state & layout::kStateFull) ||
      ((state & layout::kStateMemFull) && (state & layout::kStateSpillEnabled))) {
    return false;
  }
  header_->state.fetch_and(
      ~(layout::kStateFull | layout::kStateMemFull | layout::kStateByCap));
  cap_full_bits_ = 0;
  if (log_) log_->Info("{} takes rows again: {}", label_, why);
  return true;
}

// ---- Chunks: leased to a connection, given back, and the unused tails of a
// finished connection's chunks recycled into new ones.
layout::ChunkHeader* SegmentAllocator::HeaderAt(uint32_t seg_no, uint64_t offset) const {
  return reinterpret_cast<layout::ChunkHeader*>(segments_.at(seg_no).file.data() +
                                                offset);
}

layout::ChunkHeader* SegmentAllocator::ChunkAt(uint32_t seg_no, uint64_t offset,
                                               uint64_t size) {
  layout::ChunkHeader* h = HeaderAt(seg_no, offset);
  h->cache_id = cache_id_;
  h->size = size;
  h->used.store(sizeof(layout::ChunkHeader));
  h->magic = layout::kChunkMagic;
  return h;
}

uint64_t SegmentAllocator::ChunkSizeFor(uint64_t need, uint64_t max_bytes) {
  const uint64_t want = layout::ChunkBytesFor(need);
  if (need == 0) return max_bytes;
  if (want >= max_bytes) return want;
  // Rows of one shape (decoded tensors) come one after another: a chunk of
  // whole rows of the asking one's size leaves no tail that the next row
  // cannot use (4 MB held six 588 KB rows and a 0.55 MB tail, 14%, that
  // only a smaller row could take).
  const uint64_t rows = (max_bytes - sizeof(layout::ChunkHeader)) / need;
  return layout::ChunkBytesFor(rows * need);
}

Status SegmentAllocator::Lease(uint64_t conn, int node, uint64_t need,
                               MemoryAccount* account, ChunkLease* out, bool* wait) {
  if (wait != nullptr) *wait = false;
  if (released_) return Status::NotFound("cache was destroyed");
  if (uint32_t state = header_->state.load();
      state & (layout::kStateFull | layout::kStateMemFull)) {
    std::string msg = fmt::format("{} memory is full", Label());
    if (layout::FullByCap(state)) return Status::FullServerCap(msg);
    return Status::Full(msg);
  }
  node = (node % num_nodes_ + num_nodes_) % num_nodes_;
  const uint64_t want = layout::ChunkBytesFor(need);
  const uint64_t share = ChunkShare(conn);
  if (LeaseTail(conn, node, need, share, out)) return Status::OK();
  // The oldest open segment whose supplied pages hold the chunk; else one
  // with room whose pages are still to come. Of those, the segments no
  // other writer holds a chunk in come first (see WritingElsewhere).
  const size_t n = static_cast<size_t>(node);
  Segment* seg = nullptr;
  Segment* filling = nullptr;
  Segment* shared = nullptr;          // another writer's, its pages supplied
  Segment* shared_filling = nullptr;  // another writer's, its pages to come
  for (uint32_t no : open_[n]) {
    Segment& s = segments_.at(no);
    if (s.size - s.carved < want) continue;
    const bool ready =
        !s.supply_error.ok() || s.carved + ChunkSize(s, need, share) <= s.supplied;
    Segment*& slot = WritingElsewhere(conn, no) ? (ready ? shared : shared_filling)
                                                : (ready ? seg : filling);
    if (slot == nullptr) slot = &s;
    if (seg != nullptr) break;
  }
  if (seg == nullptr && FirstPreparedFor(node, want) != prepared_[n].end() &&
      ((filling != nullptr && wait != nullptr) || shared != nullptr ||
       shared_filling != nullptr)) {
    // The next segment made ahead, whose first pages are ready, is opened
    // (NewSegment, below) rather than waited for or shared: the writers
    // outran the open segments' page supply, or the open ones are other
    // writers'. Their pages are then supplied by as many threads as there
    // are open segments (one file is one thread's supply).
    filling = shared = shared_filling = nullptr;
  }
  // Another writer's supplied pages before waiting for this one's; once
  // writers share a segment, the next batch made ahead has one for each.
  if (seg == nullptr && shared != nullptr) seg = shared;
  if (seg == nullptr) seg = filling;
  if (seg == nullptr) seg = shared_filling;
  if (seg != nullptr && (seg == shared || seg == shared_filling)) {
    parallel_[n] = std::clamp(std::max(parallel_[n], Writers(conn)), 1, kMaxParallel);
  }
  if (seg == nullptr) {
    Status s = NewSegment(conn, node, need, share, account, &seg, wait);
    if (!s.ok() || (wait != nullptr && *wait)) return s;
    if (seg == nullptr) {
      // Room another writer held and had not used was taken back, or
      // another node's is free (the budget is used up): a tail now, the
      // rests of the open segments kept for smaller rows.
      for (int k = 0; k < num_nodes_; ++k) {
        if (LeaseTail(conn, (node + k) % num_nodes_, need, share, out)) break;
      }
      return Status::OK();
    }
    // What is left of the open segments does not hold this row: left, as
    // the rest of a segment always was, once a new one takes the rows.
    // Not before: a row that gets none (TooLarge) leaves those rests to
    // the smaller rows they still hold; nor for another node's segment.
    if (seg->node == node) {
      std::erase_if(open_[n], [&](uint32_t no) {
        const Segment& o = segments_.at(no);
        return o.size - o.carved < want;
      });
    }
  }
  const uint64_t size = ChunkSize(*seg, need, share);
  // Only supplied pages are handed out (see SegmentJob).
  Status supplied = SupplyFor(seg, seg->carved + size, wait);
  if (!supplied.ok() || (wait != nullptr && *wait)) return supplied;
  uint64_t offset = seg->carved;
  ChunkAt(seg->seg_no, offset, size);
  seg->carved += size;
  reinterpret_cast<layout::SegmentHeader*>(seg->file.data())->carved.store(seg->carved);
  *out = ChunkLease{seg->seg_no, offset, size};
  leases_[conn].push_back(*out);
  return Status::OK();
}

bool SegmentAllocator::WritingElsewhere(uint64_t conn, uint32_t seg_no) const {
  for (const auto& [other, held] : leases_) {
    if (other == conn) continue;
    for (const ChunkLease& l : held) {
      if (l.seg_no == seg_no) return true;
    }
  }
  return false;
}

int SegmentAllocator::Writers(uint64_t conn) const {
  int n = 1;  // conn's, which may hold none while it leases (its old chunk came back)
  for (const auto& [other, held] : leases_) n += other != conn && !held.empty();
  return n;
}

uint64_t SegmentAllocator::ChunkShare(uint64_t conn) const {
  const auto lessees = static_cast<uint64_t>(Writers(conn));
  return std::clamp(budget_bytes_ / std::max(kChunksPerBudget, 2 * lessees),
                    kMinRecycleBytes, kChunkBytes);
}

bool SegmentAllocator::LeaseTail(uint64_t conn, int node, uint64_t need, uint64_t share,
                                 ChunkLease* out) {
  const uint64_t want = layout::ChunkBytesFor(need);
  auto& tails = tails_[static_cast<size_t>(node)];
  auto t = std::find_if(tails.begin(), tails.end(),
                        [&](const Tail& tail) { return tail.size >= want; });
  if (t == tails.end()) return false;
  // A tail larger than a chunk is leased a chunk at a time, as a segment
  // is: a writer's share, the rest left to the next lease.
  const uint64_t chunk = std::max(want, ChunkSizeFor(need, share));
  ChunkLease lease{t->seg_no, t->offset, t->size};
  if (chunk + kMinRecycleBytes <= t->size) {
    lease.size = chunk;
    t->offset += chunk;
    t->size -= chunk;
  } else {
    tails.erase(t);
  }
  ChunkAt(lease.seg_no, lease.offset, lease.size);
  *out = lease;
  leases_[conn].push_back(lease);
  return true;
}

uint64_t SegmentAllocator::UsedMark(const ChunkLease& l, uint64_t mark) {
  // Taken from and not seen since: where its writer left the mark.
  const uint64_t used = (mark & layout::kRoomTaken) ? l.taken_at : mark;
  // A mark its writer wrote out of the chunk: nothing to take.
  if (used < sizeof(layout::ChunkHeader) || used > l.size) return l.size;
  return used;
}

SegmentAllocator::HeldRoom SegmentAllocator::MostRoomHeld(uint64_t conn, int node) {
  HeldRoom most;
  for (auto& [other, held] : leases_) {
    if (other == conn) continue;
    for (ChunkLease& l : held) {
      if (node != kAnyNode && segments_.at(l.seg_no).node != node) continue;
      const uint64_t mark = HeaderAt(l.seg_no, l.offset)->used.load();
      const uint64_t room = l.size - AlignUp(UsedMark(l, mark), layout::kCacheLine);
      if (room > most.bytes) most = HeldRoom{&l, mark, room};
    }
  }
  return most;
}

bool SegmentAllocator::TakeRoom(uint64_t conn, int node, uint64_t want) {
  HeldRoom most = MostRoomHeld(conn, node);
  if (most.lease == nullptr) return false;
  ChunkLease& l = *most.lease;
  auto& mark = HeaderAt(l.seg_no, l.offset)->used;
  // The writer keeps half of its room (less when the row needs more), in
  // whole rows of the asking one's size (rows of one shape come one after
  // another: the room past the last would be lost), and the chunk's new end
  // on a cache line (where the taken room's chunk header goes).
  const uint64_t row = std::max<uint64_t>(want - sizeof(layout::ChunkHeader), 1);
  uint64_t used = 0, end = 0;
  for (int tries = 0;; ++tries) {
    used = UsedMark(l, most.mark);
    const uint64_t half = used + (l.size - used) / 2 / row * row;
    end = std::min(
        AlignUp(half, layout::kCacheLine),
        (l.size - std::min(l.size, want)) / layout::kCacheLine * layout::kCacheLine);
    if (end < used) return false;
    if (mark.compare_exchange_strong(most.mark, end | layout::kRoomTaken)) break;
    // Its writer moved the mark meanwhile: weigh the room again.
    if (tries + 1 == kTakeTries) return false;
  }
  // Kept whatever its size: the lease that took it leases it next.
  AddTail(Tail{l.seg_no, l.offset + end, l.size - end}, 0);
  l.size = end;
  l.taken_at = used;
  return true;
}

uint64_t SegmentAllocator::ChunkSize(const Segment& seg, uint64_t need,
                                     uint64_t share) const {
  const uint64_t avail = seg.size - seg.carved;
  // A chunk ends on a 4 KB page boundary, so every carve mark lies on one:
  // a reader that registers a segment with CUDA up to its carve mark (in
  // whole pages; shmcache/torch/_cache_pages.py) ends each range where a
  // chunk ends, and no row lies across two ranges. At most a page less one
  // cache line is left per chunk (< 0.1% of kChunkBytes). A carve mark off
  // a page (an adopted segment of an older build) is brought onto one by
  // the next chunk.
  const uint64_t to_page =
      AlignUp(seg.carved + ChunkSizeFor(need, share), kPageBytes) - seg.carved;
  uint64_t size = std::min(avail, to_page);
  if (avail - size < kMinRecycleBytes) size = avail;  // no sliver left over
  // Whole cache lines without rounding: carve marks lie on lines and
  // segment sizes on pages.
  return size;
}

SegmentAllocator::Segment* SegmentAllocator::OtherNodesRoom(int node, uint64_t need,
                                                            uint64_t share) {
  Segment* to_supply = nullptr;
  for (uint32_t no : open_[static_cast<size_t>(node)]) {
    Segment& s = segments_.at(no);
    if (s.size - s.carved < layout::ChunkBytesFor(need) || !s.supply_error.ok()) continue;
    if (s.carved + ChunkSize(s, need, share) <= s.supplied) return &s;
    if (to_supply == nullptr) to_supply = &s;
  }
  // A segment made ahead for that node (counted in the budget as soon as
  // it was named) is opened there, as its own writers would have, before
  // pages of an open one are waited for.
  if (auto p = FirstPreparedFor(node, layout::ChunkBytesFor(need));
      p != prepared_[static_cast<size_t>(node)].end()) {
    const uint32_t seg_no = p->seg_no;
    AddSegment(seg_no, node, p->size, std::move(p->file), p->supplied);
    prepared_[static_cast<size_t>(node)].erase(p);
    return &segments_.at(seg_no);
  }
  return to_supply;
}

std::deque<SegmentAllocator::Prepared>::iterator SegmentAllocator::FirstPreparedFor(
    int node, uint64_t want) {
  const uint64_t min_bytes = layout::SegmentBytesFor(want);
  auto& ready = prepared_[static_cast<size_t>(node)];
  return std::find_if(ready.begin(), ready.end(),
                      [&](const Prepared& p) { return p.size >= min_bytes; });
}

void SegmentAllocator::Return(uint64_t conn, uint32_t seg_no, uint64_t offset) {
  auto it = leases_.find(conn);
  if (it == leases_.end() || released_) return;
  auto& v = it->second;
  auto l = std::find_if(v.begin(), v.end(), [&](const ChunkLease& c) {
    return c.seg_no == seg_no && c.offset == offset;
  });
  if (l == v.end()) return;  // not this connection's: ignore
  ChunkLease lease = *l;
  v.erase(l);
  layout::ChunkHeader* h = HeaderAt(lease.seg_no, lease.offset);
  // `used` was written by the client: trust it only within the chunk.
  const uint64_t used = UsedMark(lease, h->used.load());
  const uint64_t tail_off = AlignUp(lease.offset + used, layout::kCacheLine);
  const uint64_t end = lease.offset + lease.size;
  if (tail_off >= end) return;
  const uint64_t freed =
      AddTail(Tail{lease.seg_no, tail_off, end - tail_off}, kMinRecycleBytes);
  // The full mark stops every lease, a small row's too: room given back
  // after it (a writer's whose rows outgrew its chunk, at its close) would
  // be lost for the rest of the run. The next lease that finds no room for
  // its row marks the cache full again.
  if (freed > 0) {
    TakeRowsAgain(fmt::format("a writer gave back {} of room", SizeText(freed)));
  }
}

uint64_t SegmentAllocator::AddTail(Tail tail, uint64_t min_bytes) {
  auto& tails = tails_[static_cast<size_t>(segments_.at(tail.seg_no).node)];
  // Free room next to free room is one tail: a chunk's end taken back and
  // the rest of that chunk given back later.
  for (auto t = tails.begin(); t != tails.end();) {
    if (t->seg_no == tail.seg_no &&
        (t->offset + t->size == tail.offset || tail.offset + tail.size == t->offset)) {
      tail.offset = std::min(tail.offset, t->offset);
      tail.size += t->size;
      t = tails.erase(t);
    } else {
      ++t;
    }
  }
  if (tail.size < min_bytes) return 0;
  tails.push_back(tail);
  return tail.size;
}

void SegmentAllocator::ReleaseConnection(uint64_t conn, bool recycle) {
  auto it = leases_.find(conn);
  if (it == leases_.end()) return;
  std::vector<ChunkLease> held = it->second;
  if (recycle) {
    for (const ChunkLease& l : held) Return(conn, l.seg_no, l.offset);
  }
  leases_.erase(conn);
}

// ---- Segments: their sizes, their files (named, created, formatted,
// adopted), and the jobs that make the next one ahead of need.
uint64_t SegmentAllocator::NextSegmentSize(uint64_t min_bytes,
                                           const MemoryAccount& account,
                                           uint64_t max_bytes) const {
  // Grow by a quarter of what the cache holds: few segments for big caches,
  // and at most ~25% reserved but unused at the end.
  uint64_t want = std::clamp<uint64_t>(AlignUp(data_bytes_ / 4, 1 << 20),
                                       layout::kMinSegmentBytes, max_bytes);
  want = std::max(want, min_bytes);
  // Whole 2 MB pages where possible, so that huge pages can back it.
  if (want >= 2 * kHugePageBytes) want = AlignUp(want, kHugePageBytes);
  want = std::min({want, BudgetLeft(), account.available()});
  want = want / kPageBytes * kPageBytes;
  return want >= min_bytes ? want : 0;
}

uint64_t SegmentAllocator::FirstSupply(uint64_t size) {
  return SupplyEnd(layout::kSegmentHeaderSize + kSupplyAhead, size);
}

Status SegmentAllocator::CreateSegmentFile(const InstancePaths& paths, uint32_t cache_id,
                                           uint32_t seg_no, int node, uint64_t size,
                                           ShmFile* out, uint64_t supply) {
  ShmFile f;
  Status s = ShmFile::Create(paths.SegmentFile(cache_id, seg_no), size, node, &f, supply,
                             kSegmentClearing);
  if (!s.ok()) return s;
  FormatSegment(&f, cache_id, seg_no, node, size);
  *out = std::move(f);
  return Status::OK();
}

Status SegmentAllocator::CreateNextSegment(int node, uint64_t size, uint32_t* seg_no,
                                           ShmFile* out) {
  // Locations need segment numbers unique, not dense: a number whose name
  // another user took is skipped.
  const uint32_t first = next_seg_no_;
  const uint32_t tries = std::min(kSegmentNameTries, layout::kMaxSegmentId + 1 - first);
  auto name = [&](uint32_t i) { return paths_.SegmentFile(cache_id_, first + i); };
  uint32_t chosen;
  std::string skipped;
  Status s = ShmFile::CreateFresh(name, tries, size, node, out, &chosen, &skipped,
                                  FirstSupply(size), kSegmentClearing);
  if (!skipped.empty() && log_) log_->Warn("cache {}: skipped {}", cache_id_, skipped);
  // A number that failed otherwise (no room) was removed and is free again.
  next_seg_no_ = first + chosen + (s.ok() ? 1 : 0);
  if (!s.ok()) return s;
  FormatSegment(out, cache_id_, first + chosen, node, size);
  *seg_no = first + chosen;
  return Status::OK();
}

void SegmentAllocator::FormatSegment(ShmFile* f, uint32_t cache_id, uint32_t seg_no,
                                     int node, uint64_t size) {
  auto* h = reinterpret_cast<layout::SegmentHeader*>(f->data());
  h->seg_id = seg_no;
  h->cache_id = cache_id;
  h->node = static_cast<uint32_t>(node);
  h->carved.store(layout::kSegmentHeaderSize);
  h->file.version = layout::kLayoutVersion;
  h->file.header_size = sizeof(layout::SegmentHeader);
  h->file.file_size = size;
  // The magic goes last: a file without it was never finished.
  std::atomic_thread_fence(std::memory_order_release);
  h->file.magic = layout::kSegmentMagic;
}

void SegmentAllocator::AddSegment(uint32_t seg_no, int node, uint64_t size, ShmFile file,
                                  uint64_t supplied) {
  Segment seg{seg_no, node, size, layout::kSegmentHeaderSize, std::move(file)};
  seg.supplied = supplied;
  segments_.emplace(seg_no, std::move(seg));
  current_[static_cast<size_t>(node)] = static_cast<int>(seg_no);
  open_[static_cast<size_t>(node)].push_back(seg_no);
}

Status SegmentAllocator::SupplyFor(Segment* seg, uint64_t end, bool* wait) {
  if (!seg->supply_error.ok()) {
    // The last job found no room (or failed otherwise): this lease says so.
    Status s = std::move(seg->supply_error);
    seg->supply_error = Status::OK();
    if (s.IsFull()) MarkFull(s.message());
    if (log_) log_->Error("cache {}: {}", cache_id_, s.message());
    return s;
  }
  if (end <= seg->supplied) return Status::OK();
  if (wait != nullptr) {
    seg->supply_need = std::max(seg->supply_need, end);
    *wait = true;
    return Status::OK();
  }
  if (seg->supplying) {
    // Clearing pages a job may still be clearing would clear rows written
    // meanwhile; only a stopping server leases without waiting.
    return Status::Unavailable(
        fmt::format("cache {}: the pages of segment {} are still being supplied",
                    cache_id_, seg->seg_no));
  }
  const uint64_t to = SupplyEnd(std::max(end, seg->supplied + kSupplyStep), seg->size);
  Status s = ShmFile::Supply(paths_.SegmentFile(cache_id_, seg->seg_no), seg->supplied,
                             to, kSegmentClearing);
  if (!s.ok()) {
    if (s.IsFull()) MarkFull(s.message());
    if (log_) log_->Error("cache {}: {}", cache_id_, s.message());
    return s;
  }
  seg->supplied = to;
  return Status::OK();
}

Status SegmentAllocator::NewSegment(uint64_t conn, int node, uint64_t row_bytes,
                                    uint64_t share, MemoryAccount* account, Segment** out,
                                    bool* wait) {
  const size_t n = static_cast<size_t>(node);
  const uint64_t need = layout::ChunkBytesFor(row_bytes);
  uint64_t min_bytes = layout::SegmentBytesFor(need);
  auto& ready = prepared_[n];
  auto fits = FirstPreparedFor(node, need);
  if (fits != ready.end()) {
    uint32_t seg_no = fits->seg_no;
    AddSegment(seg_no, node, fits->size, std::move(fits->file), fits->supplied);
    ready.erase(fits);
    *out = &segments_.at(seg_no);
    return Status::OK();
  }
  if (wait != nullptr && preparing_[n] > 0) {
    // Its memory is already reserved; making another would waste it, or
    // find the budget spent. The writers outran the supply: the next batch
    // is made by more threads.
    parallel_[n] = std::min(parallel_[n] * 2, kMaxParallel);
    *wait = true;
    return Status::OK();
  }
  uint64_t want = NextSegmentSize(min_bytes, *account);
  if (want == 0) {
    // The budget or the cap is used up: the room other writers hold and
    // have not used (one that ran out of rows, or got a chunk before many
    // writers came) is taken before the cache is full. Then the other
    // nodes' room: the budget is the whole cache's, and a writer on one
    // node made the cache full for all while another node's segments or
    // chunks had room.
    *out = nullptr;
    if (TakeRoom(conn, node, need)) return Status::OK();
    for (int k = 1; k < num_nodes_; ++k) {
      const int other = (node + k) % num_nodes_;
      const auto& tails = tails_[static_cast<size_t>(other)];
      if (std::any_of(tails.begin(), tails.end(),
                      [&](const Tail& t) { return t.size >= need; })) {
        return Status::OK();
      }
      if (Segment* room = OtherNodesRoom(other, row_bytes, share); room != nullptr) {
        *out = room;
        return Status::OK();
      }
      if (wait != nullptr && preparing_[static_cast<size_t>(other)] > 0) {
        // A segment being made for that node holds budget too.
        *wait = true;
        return Status::OK();
      }
    }
    if (TakeRoom(conn, kAnyNode, need)) return Status::OK();
    return NoRoomFor(conn, need, min_bytes, *account);
  }
  if (next_seg_no_ > layout::kMaxSegmentId) {
    MarkFull("too many segments");
    return Status::Full("cache has too many segments");
  }
  uint32_t seg_no = 0;
  ShmFile f;
  Status s = CreateNextSegment(node, want, &seg_no, &f);
  if (!s.ok()) {
    if (s.IsFull()) MarkFull(s.message());
    if (log_) log_->Error("cache {}: {}", cache_id_, s.message());
    return s;
  }
  account->Reserve(want);
  data_bytes_ += want;
  AddSegment(seg_no, node, want, std::move(f), FirstSupply(want));
  *out = &segments_.at(seg_no);
  return Status::OK();
}

std::vector<SegmentJob> SegmentAllocator::TakeSegmentJobs(int node,
                                                          MemoryAccount* account,
                                                          int max_jobs) {
  const size_t n = static_cast<size_t>(node);
  std::vector<SegmentJob> jobs;
  if (released_ || preparing_[n] > 0 || current_[n] < 0) return jobs;
  const Segment& cur = segments_.at(static_cast<uint32_t>(current_[n]));
  uint64_t ahead = 0;
  for (uint32_t no : open_[n]) ahead += segments_.at(no).size - segments_.at(no).carved;
  for (const Prepared& p : prepared_[n]) ahead += p.size;
  if (ahead > std::max(cur.size, batch_bytes_[n]) / 2) return jobs;
  const uint64_t k_max = static_cast<uint64_t>(
      std::clamp(std::min(parallel_[n], max_jobs), 1, kMaxParallel));
  const uint64_t total = NextSegmentSize(layout::kMinSegmentBytes, *account,
                                         k_max * layout::kMaxSegmentBytes);
  if (total == 0) return jobs;
  const uint64_t k = std::clamp<uint64_t>(total / layout::kMinSegmentBytes, 1, k_max);
  // Whole 2 MB pages where possible (as NextSegmentSize), and whole 4 KB
  // ones always; the last segment takes the rest.
  const uint64_t align = total / k >= 2 * kHugePageBytes ? kHugePageBytes : kPageBytes;
  const uint64_t each = total / k / align * align;
  batch_bytes_[n] = total;
  for (uint64_t i = 0; i < k && next_seg_no_ <= layout::kMaxSegmentId; ++i) {
    const uint64_t size = i + 1 < k ? each : total - each * (k - 1);
    // Reserved now, so that budgets and the cap hold while the file is made.
    account->Reserve(size);
    data_bytes_ += size;
    ++preparing_[n];
    jobs.push_back(
        SegmentJob{cache_id_, next_seg_no_++, node, size, true, 0, FirstSupply(size)});
  }
  return jobs;
}

std::vector<SegmentJob> SegmentAllocator::TakeSupplyJobs(int node) {
  std::vector<SegmentJob> jobs;
  // A full cache leases nothing more: its pages would be made for nobody.
  if (released_ || header_->state.load() & (layout::kStateFull | layout::kStateMemFull)) {
    return jobs;
  }
  for (uint32_t no : open_[static_cast<size_t>(node)]) {
    Segment& seg = segments_.at(no);
    if (seg.supplying || seg.supplied >= seg.size || !seg.supply_error.ok()) continue;
    if (seg.supplied - seg.carved >= kSupplyAhead && seg.supply_need <= seg.supplied) {
      continue;
    }
    const uint64_t to =
        SupplyEnd(std::max(seg.supplied + kSupplyStep, seg.supply_need), seg.size);
    seg.supplying = true;
    jobs.push_back(
        SegmentJob{cache_id_, seg.seg_no, seg.node, seg.size, false, seg.supplied, to});
  }
  return jobs;
}

Status SegmentAllocator::RunSegmentJob(const InstancePaths& paths, const SegmentJob& job,
                                       ShmFile* file) {
  if (job.create) {
    return CreateSegmentFile(paths, job.cache_id, job.seg_no, job.node, job.size, file,
                             job.supply_to);
  }
  return ShmFile::Supply(paths.SegmentFile(job.cache_id, job.seg_no), job.supply_from,
                         job.supply_to, kSegmentClearing);
}

void SegmentAllocator::FinishSegmentJob(const SegmentJob& job, const Status& made,
                                        ShmFile file, MemoryAccount* account,
                                        const std::function<void()>& keeping) {
  size_t n = static_cast<size_t>(job.node);
  if (!job.create) {
    auto it = segments_.find(job.seg_no);
    if (released_ || it == segments_.end()) return;
    Segment& seg = it->second;
    seg.supplying = false;
    if (made.ok()) {
      seg.supplied = std::max(seg.supplied, job.supply_to);
    } else {
      seg.supply_error = made;
    }
    return;
  }
  if (released_) {
    // Release already released the reservation and unlinked what it knew.
    ShmFile::Unlink(paths_.SegmentFile(cache_id_, job.seg_no)).PermitUncheckedError();
    return;
  }
  if (!made.ok()) {
    --preparing_[n];
    account->Release(job.size);
    data_bytes_ -= job.size;
    if (log_)
      log_->Warn("cache {}: preparing a segment failed: {}", cache_id_, made.message());
    return;
  }
  // Handed out in the order they were named, whichever finished first.
  // Kept before the job counts as done: a throw here (the deque's insert
  // allocates a block before it moves an element, and its moves do not
  // throw) leaves everything as it was, for the caller to end the job as a
  // failed one (the header says how).
  static_assert(std::is_nothrow_move_constructible_v<Prepared> &&
                std::is_nothrow_move_assignable_v<Prepared>);
  if (keeping) keeping();
  auto& ready = prepared_[n];
  auto at = std::find_if(ready.begin(), ready.end(),
                         [&](const Prepared& p) { return p.seg_no > job.seg_no; });
  ready.insert(at, Prepared{job.seg_no, job.size, std::move(file), job.supply_to});
  --preparing_[n];
}

Status SegmentAllocator::AdoptSegment(uint32_t seg_no) {
  std::string path = paths_.SegmentFile(cache_id_, seg_no);
  ShmFile f;
  Status s = ShmFile::Open(path, &f);
  if (!s.ok()) return s;
  if (f.size() >= sizeof(layout::FileHeader) &&
      reinterpret_cast<layout::FileHeader*>(f.data())->magic == 0) {
    // Being prepared when the daemon died; nothing points into it.
    f.Unmap();
    ShmFile::Unlink(path).PermitUncheckedError();
    return Status::OK();
  }
  if (const char* bad = layout::CheckSegmentFile(f.data(), f.size(), cache_id_, seg_no)) {
    return Status::Corruption(path + ": " + bad);
  }
  auto* sh = reinterpret_cast<layout::SegmentHeader*>(f.data());
  uint64_t carved = sh->carved.load();
  // Chunks start on cache lines (their headers hold atomics): a carved mark
  // off one would put the next chunk's header astride two.
  if (sh->node >= static_cast<uint32_t>(num_nodes_) ||
      carved < layout::kSegmentHeaderSize || carved > f.size() ||
      carved % layout::kCacheLine != 0) {
    return Status::Corruption(path + ": segment header fields out of range");
  }
  // Chunks leased by the previous daemon stay with whoever holds them;
  // only the space never carved is handed out again, from the last segment
  // carved (segments come in order).
  uint64_t size = f.size();
  data_bytes_ += size;
  const int node = static_cast<int>(sh->node);
  const size_t n = static_cast<size_t>(node);
  next_seg_no_ = std::max(next_seg_no_, seg_no + 1);
  if (carved == layout::kSegmentHeaderSize) {
    // Made ahead of need and never used: handed out when the node's
    // current segment is used up, as it would have been.
    prepared_[n].push_back(
        Prepared{seg_no, size, std::move(f), layout::kSegmentHeaderSize});
    return Status::OK();
  }
  Segment seg{seg_no, node, size, carved, std::move(f)};
  seg.supplied = carved;
  segments_.emplace(seg_no, std::move(seg));
  // The last one carved is where carving goes on (segments come in order).
  // An earlier one whose rest still holds a whole chunk stays open beside
  // it, as it was for the earlier server (writers that outran a segment's
  // supply opened the next beside it): that rest is carved again, oldest
  // first, rather than lost to the restart while the budget counts it. A
  // smaller rest is left, as it was when the next segment was opened.
  current_[n] = static_cast<int>(seg_no);
  std::erase_if(open_[n], [&](uint32_t no) {
    const Segment& s = segments_.at(no);
    return s.size - s.carved < kChunkBytes;
  });
  open_[n].push_back(seg_no);
  return Status::OK();
}

// ---- The budget: what is left of it and of the server's cap, and what the
// cache says when one of them is used up.

uint64_t SegmentAllocator::BudgetLeft() const {
  return budget_bytes_ > data_bytes_ ? budget_bytes_ - data_bytes_ : 0;
}

Status SegmentAllocator::NoRoomFor(uint64_t conn, uint64_t chunk_bytes,
                                   uint64_t min_bytes, const MemoryAccount& account) {
  const uint64_t left = BudgetLeft();
  const uint64_t room = std::min(left, account.available());
  const uint64_t largest = LargestRowNow(room, MostRoomHeld(conn, kAnyNode).bytes);
  // The rows the writers counted so far. None counted says nothing of
  // their size (a writer counts once per window of rows, and before its
  // next lease: another's first row finds the rows of a batch in flight
  // uncounted): any room a row still has is room enough.
  const CacheStats cached = ReadCacheStats(*header_, true);
  if (room >= layout::kMinSegmentBytes ||
      (largest > 0 && (cached.mem_rows == 0 || largest >= cached.avg_row_bytes()))) {
    // Room for ordinary rows is left: a new segment, or room where a row
    // of the size the cache took so far still fits. Refusing them all for
    // one big row would waste it; the first of them that finds none makes
    // the cache full.
    std::string where =
        room < left ? fmt::format("{} left under the server's memory cap of {} MB",
                                  SizeText(room), account.cap >> 20)
                    : fmt::format("{} of its budget of {} MB left for new segments",
                                  SizeText(room), budget_bytes_ >> 20);
    const auto [row, most] =
        RowAndMost(chunk_bytes - sizeof(layout::ChunkHeader), largest);
    return Status::TooLarge(fmt::format(
        "a row of {} does not fit in {}: the most one row can take in it now is "
        "{} (its memory is made in segments: {}); it is not cached, smaller rows "
        "still are; to cache rows this large, open the cache with a larger size_mb",
        row, Label(), most, where));
  }
  if (left < min_bytes) {
    return MemoryUsedUp(
        fmt::format("its budget of {} MB is used up", budget_bytes_ >> 20), false);
  }
  return MemoryUsedUp(
      fmt::format("the server's memory cap of {} MB is used up", account.cap >> 20),
      true);
}

uint64_t SegmentAllocator::LargestRowNow(uint64_t room, uint64_t held) const {
  // A segment of `bytes` holds the chunks that SegmentBytesFor fits in it:
  // its whole grains less its header.
  const auto in_segment = [](uint64_t bytes) -> uint64_t {
    const uint64_t whole = bytes / layout::kSegmentGrain * layout::kSegmentGrain;
    return whole > layout::kSegmentHeaderSize ? whole - layout::kSegmentHeaderSize : 0;
  };
  uint64_t chunk = std::max(held, in_segment(room / kPageBytes * kPageBytes));
  for (const auto& tails : tails_) {
    for (const Tail& t : tails) chunk = std::max(chunk, t.size);
  }
  // Every node's: a lease takes another node's room before the cache is
  // full (NewSegment).
  for (const auto& open : open_) {
    for (uint32_t no : open) {
      const Segment& seg = segments_.at(no);
      chunk = std::max(chunk, seg.size - seg.carved);
    }
  }
  for (const auto& ready : prepared_) {
    for (const Prepared& p : ready) chunk = std::max(chunk, in_segment(p.size));
  }
  // ChunkBytesFor's whole cache lines, the header among them.
  chunk = chunk / layout::kCacheLine * layout::kCacheLine;
  return chunk > sizeof(layout::ChunkHeader) ? chunk - sizeof(layout::ChunkHeader) : 0;
}

Status SegmentAllocator::MemoryUsedUp(const std::string& why, bool by_cap) {
  if (header_->state.load() & layout::kStateSpillEnabled) {
    if (!(header_->state.fetch_or(layout::kStateMemFull) & layout::kStateMemFull) &&
        log_) {
      log_->Info("cache {}: {}; further rows spill to disk", cache_id_, why);
    }
    if (by_cap) MarkByCap(layout::kStateMemFull);
    return FullStatus(
        fmt::format("{} memory is full: {}; rows spill to disk", Label(), why), by_cap);
  }
  MarkFull(why);
  if (by_cap) MarkByCap(layout::kStateFull);
  return FullStatus(fmt::format("{} is full: {}", Label(), why), by_cap);
}

bool SegmentAllocator::RaiseBudget(uint64_t bytes) {
  if (bytes <= budget_bytes_ || released_) return false;
  const uint64_t old = budget_bytes_;
  budget_bytes_ = bytes;
  header_->budget_bytes.store(bytes);
  const std::string why =
      fmt::format("budget raised from {} MB to {} MB by an open asking for more",
                  old >> 20, bytes >> 20);
  // The cap, not the budget, made it full: it stays so (ResumeIfCapAllows).
  if ((cap_full_bits_ != 0 || !TakeRowsAgain(why)) && log_) {
    log_->Info("{}: {}", label_, why);
  }
  return true;
}

void SegmentAllocator::MarkByCap(uint32_t bits) {
  cap_full_bits_ |= bits;
  header_->state.fetch_or(layout::kStateByCap);
}

bool SegmentAllocator::ResumeIfCapAllows(const MemoryAccount& account) {
  if (cap_full_bits_ == 0 || released_ ||
      account.available() < layout::kMinSegmentBytes) {
    return false;
  }
  header_->state.fetch_and(~(cap_full_bits_ | layout::kStateByCap));
  cap_full_bits_ = 0;
  if (log_) {
    log_->Info("{} takes rows again: {} MB are free under the server's memory cap",
               label_, account.available() >> 20);
  }
  return true;
}

}  // namespace shmcache
