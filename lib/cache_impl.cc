// CacheImpl: attaching to a cache, mapping its index tables and segments
// as they appear, and this process's statistics line.

#include "lib/cache_impl.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "format/cache_stats.h"
#include "format/numa_topology.h"
#include "format/row_codec.h"

namespace shmcache {

CacheImpl::CacheImpl(std::shared_ptr<ClientImpl> client, uint32_t cache_id,
                     uint32_t session_id)
    : client_(std::move(client)), cache_id_(cache_id), session_id_(session_id) {}

CacheImpl::~CacheImpl() { Close(); }

Status CacheImpl::Attach(const std::shared_ptr<ClientImpl>& client, uint32_t cache_id,
                         uint32_t session_id, std::shared_ptr<CacheImpl>* out) {
  std::shared_ptr<CacheImpl> c(new CacheImpl(client, cache_id, session_id));
  std::string path = client->paths().CacheFile(cache_id);
  Status s = ShmFile::Open(path, &c->header_file_);
  if (!s.ok()) return s;
  if (const char* bad =
          layout::CheckFileHeader(c->header_file_.data(), c->header_file_.size(),
                                  layout::kCacheMagic, sizeof(layout::CacheHeader))) {
    return Status::Corruption(path + ": " + bad);
  }
  c->header_ = reinterpret_cast<layout::CacheHeader*>(c->header_file_.data());
  if (c->header_->cache_id != cache_id || c->header_->session_id != session_id) {
    return Status::Corruption(path + ": belongs to another cache");
  }
  c->stats_slot_.store(client->client_id() % layout::kStatsSlots);
  c->stats_fork_gen_.store(ForkGeneration());
  c->lane_.store(c->TakeLane(client->client_id()));
  c->single_node_ = NumaTopology::Get().num_nodes() == 1;
  {
    ForkSafeLock lock(&c->put_mu_);  // nobody else sees c yet; for the analysis
    c->chunks_.resize(static_cast<size_t>(NumaTopology::Get().num_nodes()));
    c->chunk_fork_gen_ = ForkGeneration();
  }
  s = c->MapNewTables();
  if (!s.ok()) return s;
  *out = std::move(c);
  return Status::OK();
}

Status CacheImpl::Usable() const {
  if (closed_.load(std::memory_order_relaxed)) {
    return Status::InvalidArgument("cache is closed");
  }
  if (header_->state.load(std::memory_order_relaxed) & layout::kStateDestroyed) {
    return Status::NotFound(fmt::format("session {} was destroyed", session_id_));
  }
  return Status::OK();
}

Status CacheImpl::MapNewTables() {
  ForkSafeLock lock(&map_mu_);
  uint32_t have = num_tables_.load(std::memory_order_relaxed);
  uint32_t want = header_->num_tables.load(std::memory_order_acquire);
  if (want > layout::kMaxTables) return Status::Corruption("too many index tables");
  for (uint32_t g = have; g < want; ++g) {
    uint64_t cap = header_->tables[g].capacity.load(std::memory_order_acquire);
    std::string path = client_->paths().TableFile(cache_id_, g, header_->tables[g].tag);
    ShmFile f;
    Status s = ShmFile::Open(path, &f);
    if (!s.ok()) return s;
    if (const char* bad = layout::CheckTableFile(f.data(), f.size(), cap, g)) {
      return Status::Corruption(path + ": " + bad);
    }
    tables_[g] = IndexTable(reinterpret_cast<layout::TableHeader*>(f.data()));
    table_files_[g] = std::move(f);
    num_tables_.store(g + 1, std::memory_order_release);
  }
  return Status::OK();
}

uint32_t CacheImpl::MapTablesForLookup() {
  MapNewTables().PermitUncheckedError();
  return num_tables_.load(std::memory_order_acquire);
}

Status CacheImpl::SegmentFor(uint32_t seg_no, const MappedSegment** out) {
  if (const MappedSegment* m = segments_.Find(seg_no)) {
    *out = m;
    return Status::OK();
  }
  ForkSafeLock lock(&map_mu_);
  if (const MappedSegment* m = segments_.Find(seg_no)) {
    *out = m;
    return Status::OK();
  }
  std::string path = client_->paths().SegmentFile(cache_id_, seg_no);
  ShmFile f, read_only;
  Status s = ShmFile::Open(path, &f, &read_only);
  if (!s.ok()) return s;
  if (const char* bad = layout::CheckSegmentFile(f.data(), f.size(), cache_id_, seg_no)) {
    return Status::Corruption(path + ": " + bad);
  }
  int node = static_cast<int>(reinterpret_cast<layout::SegmentHeader*>(f.data())->node);
  *out = segments_.Insert(seg_no, std::move(f), std::move(read_only), node);
  return *out ? Status::OK() : Status::Corruption("segment number out of range");
}

Status CacheImpl::Resolve(uint64_t id, uint64_t loc, RowView* view, int* node) {
  const MappedSegment* seg = segments_.Find(layout::LocationSegment(loc));
  if (seg == nullptr) {
    Status s = SegmentFor(layout::LocationSegment(loc), &seg);
    if (!s.ok()) return s;
  }
  uint64_t off = layout::LocationOffset(loc);
  if (off < layout::kSegmentHeaderSize || off >= seg->size || off % 8 != 0) {
    return Status::Corruption("index entry points outside its segment");
  }
  if (!RowCodec::DecodeHeader(reinterpret_cast<const std::byte*>(seg->read_base + off),
                              seg->size - off, id, view)) {
    return Status::Corruption(
        fmt::format("index entry for row {} points at a row that does not match", id));
  }
  view->in_shared_memory_ = true;
  *node = seg->node;
  return Status::OK();
}

layout::StatsSlot* CacheImpl::Stats() {
  // A forked child would share its parent's line and lane: give it its
  // own. One thread (the CAS's winner) re-picks them.
  uint64_t gen = stats_fork_gen_.load(std::memory_order_relaxed);
  if (gen != ForkGeneration() && stats_fork_gen_.compare_exchange_strong(
                                     gen, ForkGeneration(), std::memory_order_relaxed)) {
    const uint32_t pick = client_->client_id() + static_cast<uint32_t>(getpid());
    lane_.store(nullptr, std::memory_order_relaxed);
    lane_thread_.store(nullptr, std::memory_order_relaxed);
    stats_slot_.store(pick % layout::kStatsSlots, std::memory_order_relaxed);
    lane_.store(TakeLane(pick), std::memory_order_relaxed);
  }
  return &header_->stats[stats_slot_.load(std::memory_order_relaxed)];
}

layout::StatsLane* CacheImpl::TakeLane(uint32_t i) {
  layout::StatsLane& lane = header_->lanes[i % layout::kStatsSlots];
  const uint64_t me = static_cast<uint64_t>(getpid());
  uint64_t owner = lane.owner.load(std::memory_order_relaxed);
  // A lane whose owner is gone keeps its counts; the next owner adds on.
  // One this process holds already (the cache opened twice) is not shared:
  // two threads would count in it.
  if (owner == me) return nullptr;
  if (owner != 0 && !(kill(static_cast<pid_t>(owner), 0) != 0 && errno == ESRCH)) {
    return nullptr;
  }
  return lane.owner.compare_exchange_strong(owner, me, std::memory_order_acq_rel)
             ? &lane
             : nullptr;
}

void CacheImpl::ReleaseLane() {
  layout::StatsLane* lane = lane_.exchange(nullptr);
  if (lane == nullptr || stats_fork_gen_.load() != ForkGeneration()) return;
  uint64_t me = static_cast<uint64_t>(getpid());
  lane->owner.compare_exchange_strong(me, 0, std::memory_order_acq_rel);
}

layout::StatsLane* CacheImpl::OwnLane() {
  // The thread pointer names a live thread; a forked child's only thread
  // has its parent's, which is why callers check the fork generation.
  const void* me = __builtin_thread_pointer();
  const void* owner = lane_thread_.load(std::memory_order_relaxed);
  if (owner == nullptr && lane_.load(std::memory_order_relaxed) != nullptr &&
      lane_thread_.compare_exchange_strong(owner, me, std::memory_order_relaxed)) {
    owner = me;
  }
  return owner == me ? lane_.load(std::memory_order_relaxed) : nullptr;
}

void CacheImpl::CountRead(bool hit, int node) {
  // On a single-node host every hit is a Numa hit: the readers of the
  // statistics count them, and the hit path saves an add.
  const bool numa = hit && !single_node_ && node == NumaTopology::Get().CurrentNode();
  layout::StatsLane* lane = LaneOfThisThread();
  layout::StatsSlot* slot = nullptr;
  if (lane == nullptr) {
    slot = Stats();  // re-picks the line and the lane in a forked child
    lane = OwnLane();
  }
  if (lane != nullptr) {
    BumpLane(hit ? lane->hits : lane->misses);
    if (numa) BumpLane(lane->numa_hits);
    return;
  }
  (hit ? slot->hits : slot->misses).fetch_add(1, std::memory_order_relaxed);
  if (numa) slot->numa_hits.fetch_add(1, std::memory_order_relaxed);
}

void CacheImpl::CountSpillReads(uint64_t n) {
  if (n == 0) return;
  Stats();  // re-picks the lane in a forked child
  layout::StatsLane* lane = lane_.load(std::memory_order_relaxed);
  if (lane != nullptr) lane->spill_reads.fetch_add(n, std::memory_order_relaxed);
}

Status CacheImpl::GetStats(CacheStats* out) {
  Status s = Usable();
  if (!s.ok()) return s;
  *out = ReadCacheStats(*header_, single_node_);
  return Status::OK();
}

bool CacheImpl::IsFull() const {
  return layout::IsFull(header_->state.load(std::memory_order_relaxed));
}

void CacheImpl::Close() {
  if (closed_.exchange(true)) return;
  ReleaseLane();
  ForkSafeLock lock(&put_mu_);
  ReturnChunksLocked();
}

}  // namespace shmcache
