#include "lib/stats_lanes.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "format/numa_topology.h"

namespace shmcache {

StatsLanes::StatsLanes(layout::CacheHeader* header, uint32_t client_id, bool single_node)
    : header_(header), client_id_(client_id), single_node_(single_node) {
  slot_.store(client_id % layout::kStatsSlots);
  fork_gen_.store(ForkGeneration());
  lane_.store(TakeLane(client_id));
}

layout::StatsSlot* StatsLanes::Slot() {
  // A forked child would share its parent's slot and lane: give it its
  // own. One thread (the CAS's winner) re-picks them.
  uint64_t gen = fork_gen_.load(std::memory_order_relaxed);
  if (gen != ForkGeneration() && fork_gen_.compare_exchange_strong(
                                     gen, ForkGeneration(), std::memory_order_relaxed)) {
    const uint32_t pick = client_id_ + static_cast<uint32_t>(getpid());
    lane_.store(nullptr, std::memory_order_relaxed);
    lane_thread_.store(nullptr, std::memory_order_relaxed);
    slot_.store(pick % layout::kStatsSlots, std::memory_order_relaxed);
    lane_.store(TakeLane(pick), std::memory_order_relaxed);
  }
  return &header_->stats[slot_.load(std::memory_order_relaxed)];
}

layout::StatsLane* StatsLanes::TakeLane(uint32_t i) {
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

void StatsLanes::Release() {
  layout::StatsLane* lane = lane_.exchange(nullptr);
  if (lane == nullptr || fork_gen_.load() != ForkGeneration()) return;
  uint64_t me = static_cast<uint64_t>(getpid());
  lane->owner.compare_exchange_strong(me, 0, std::memory_order_acq_rel);
}

layout::StatsLane* StatsLanes::OwnLane() {
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

void StatsLanes::CountRead(bool hit, int node) {
  // On a single-node host every hit is a Numa hit: the readers of the
  // statistics count them, and the hit path saves an add.
  const bool numa = hit && LocalHit(node);
  layout::StatsLane* lane = LaneOfThisThread();
  layout::StatsSlot* slot = nullptr;
  if (lane == nullptr) {
    slot = Slot();  // re-picks the slot and the lane in a forked child
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

bool StatsLanes::LocalHit(int node) const {
  return !single_node_ && node == NumaTopology::Get().CurrentNode();
}

void StatsLanes::CountReads(uint64_t hits, uint64_t local_hits, uint64_t misses) {
  layout::StatsLane* lane = LaneOfThisThread();
  layout::StatsSlot* slot = nullptr;
  if (lane == nullptr) {
    slot = Slot();  // re-picks the slot and the lane in a forked child
    lane = OwnLane();
  }
  auto add = [](std::atomic<uint64_t>& c, uint64_t n, bool one_writer) {
    if (n == 0) return;
    if (one_writer) {
      c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    } else {
      c.fetch_add(n, std::memory_order_relaxed);
    }
  };
  if (lane != nullptr) {
    add(lane->hits, hits, true);
    add(lane->misses, misses, true);
    add(lane->numa_hits, local_hits, true);
    return;
  }
  add(slot->hits, hits, false);
  add(slot->misses, misses, false);
  add(slot->numa_hits, local_hits, false);
}

void StatsLanes::CountSpillReads(uint64_t n) {
  if (n == 0) return;
  Slot();  // re-picks the lane in a forked child
  layout::StatsLane* lane = lane_.load(std::memory_order_relaxed);
  if (lane != nullptr) lane->spill_reads.fetch_add(n, std::memory_order_relaxed);
}

void StatsLanes::CountPuts(uint64_t rows, uint64_t bytes) {
  layout::StatsSlot* slot = Slot();
  slot->rows.fetch_add(rows, std::memory_order_relaxed);
  slot->bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void StatsLanes::CountPutsFull(uint64_t n) {
  Slot()->puts_full.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace shmcache
