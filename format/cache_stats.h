// The statistics of one cache as its shared-memory header holds them, read
// the same way by the library (Cache::GetStats) and the daemon (listings).
#pragma once

#include "format/layout.h"
#include "shmcache/stats.h"

namespace shmcache {

// Identity, budget and reservation from `header`, the counters summed over
// its stats slots, and `full` / `spills_now` by layout::IsFull / SpillsNow.
// single_node: the host has one NUMA node, where every hit is a NUMA hit
// (readers do not count those there). spill_reads holds the spilled rows
// readers read from the spill database themselves; the daemon adds those
// it read for them.
CacheStats ReadCacheStats(const layout::CacheHeader& header, bool single_node);

}  // namespace shmcache
