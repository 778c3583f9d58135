// StatsLanes: where this process counts its reads and puts of one cache in
// the cache's shared statistics (layout.h: StatsSlot, StatsLane).
//
// A process counts in one stats slot (client id % kStatsSlots: atomic adds,
// from any thread) and, when it could take one, in a stats lane: the first
// of its threads to count a read is the lane's one writer and counts hits
// and misses there with a plain load and store, no locked add (a locked add
// on every hit fences that hit's memory misses off from the next one's).
// Other threads count in the slot. The readers of the statistics add lanes
// and slots up (ReadCacheStats).
//
// A lane belongs to one process at a time: taken by CAS of its owner field
// from 0, or from a pid that is gone; given back by Release. A forked child
// shares its parent's memory but not its lane: its first count after the
// fork re-picks a slot and a lane of its own (the fork generation changed).
//
// Thread safety: every method from any thread.
#pragma once

#include <atomic>
#include <cstdint>

#include "format/layout.h"
#include "lib/fork_safety.h"

namespace shmcache {

class StatsLanes {
 public:
  // Counts into `header` (which outlives this object) as client
  // `client_id`; single_node: the host has one NUMA node, where every hit
  // is a NUMA hit and none is counted as such (ReadCacheStats adds them).
  StatsLanes(layout::CacheHeader* header, uint32_t client_id, bool single_node);
  StatsLanes(const StatsLanes&) = delete;
  StatsLanes& operator=(const StatsLanes&) = delete;

  // CountRead(true, node) for the hit path: inline where the calling thread
  // owns this process's lane on a single-node host (a plain load and
  // store), CountRead otherwise.
  void CountHit(int node) {
    if (!CountHitInLane()) CountRead(true, node);
  }
  // CountHit's inline half: counts the hit and returns true where CountHit
  // would count it in the lane; false (nothing counted) otherwise. For a
  // hit path that must make no call (Cache::Get's).
  bool CountHitInLane() {
    if (single_node_) {
      if (layout::StatsLane* lane = LaneOfThisThread()) {
        BumpLane(lane->hits);
        return true;
      }
    }
    return false;
  }
  // A read that found its row (hit; `node`: its segment's NUMA node, -1
  // for a row read from disk) or did not.
  void CountRead(bool hit, int node);
  // A batch's reads counted at once: `hits` (of them `local_hits` in a
  // segment on this thread's NUMA node, LocalHit) and `misses`. One add
  // per counter and call: the copy threads of one batch read side by side,
  // and an add per row from each of them onto the process's one slot moves
  // its cache line between their cores on every row (issue 36).
  void CountReads(uint64_t hits, uint64_t local_hits, uint64_t misses);
  // Whether a hit in a segment of NUMA node `node` counts as a local one
  // (never on a single-node host: the readers of the statistics add those).
  bool LocalHit(int node) const;
  // `n` spilled rows read from the spill database in this process (in its
  // lane; a process without one, e.g. the cache's second opening in one
  // process, does not count them).
  void CountSpillReads(uint64_t n);
  // Rows a put published in memory and their encoded bytes.
  void CountPuts(uint64_t rows, uint64_t bytes);
  // Puts refused because the cache was full.
  void CountPutsFull(uint64_t n);
  // Gives the lane back (its counts stay), unless a fork made this process
  // another than the one that took it. Counting after Release goes to the
  // slot.
  void Release();

  bool single_node() const { return single_node_; }

 private:
  // This process's lane when the calling thread is the one counting in it
  // and no fork happened since it was taken; nullptr otherwise.
  layout::StatsLane* LaneOfThisThread() const {
    if (lane_thread_.load(std::memory_order_relaxed) == __builtin_thread_pointer() &&
        fork_gen_.load(std::memory_order_relaxed) == ForkGeneration()) {
      return lane_.load(std::memory_order_relaxed);
    }
    return nullptr;
  }
  // A lane's one writer counts with a plain load and store.
  static void BumpLane(std::atomic<uint64_t>& c) {
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  // This process's slot, after re-picking slot and lane in a forked child.
  layout::StatsSlot* Slot();
  // The lane, when the calling thread is (or now becomes) its writer.
  layout::StatsLane* OwnLane();
  // Takes lanes[i % kStatsSlots] for this process: free, or its owner gone.
  // nullptr when another live process (or this one) holds it.
  layout::StatsLane* TakeLane(uint32_t i);

  layout::CacheHeader* const header_;
  const uint32_t client_id_;
  const bool single_node_;
  std::atomic<uint32_t> slot_{0};
  std::atomic<uint64_t> fork_gen_{0};  // of the process slot_ and lane_ are for
  // The lane (nullptr: none) and the one thread counting in it: a token,
  // that thread's thread pointer.
  std::atomic<layout::StatsLane*> lane_{nullptr};
  std::atomic<const void*> lane_thread_{nullptr};
};

}  // namespace shmcache
