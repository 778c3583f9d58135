#include "format/cache_stats.h"

namespace shmcache {

CacheStats ReadCacheStats(const layout::CacheHeader& header, bool single_node) {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  CacheStats out;
  out.session_id = header.session_id;
  out.cache_id = header.cache_id;
  out.name.assign(header.name, header.name_len);
  for (const layout::StatsSlot& slot : header.stats) {
    out.hits += slot.hits.load(kRelaxed);
    out.misses += slot.misses.load(kRelaxed);
    out.numa_hits += slot.numa_hits.load(kRelaxed);
    out.mem_rows += slot.rows.load(kRelaxed);
    out.mem_bytes += slot.bytes.load(kRelaxed);
    out.disk_rows += slot.disk_rows.load(kRelaxed);
    out.disk_bytes += slot.disk_bytes.load(kRelaxed);
    out.puts_full += slot.puts_full.load(kRelaxed);
  }
  for (const layout::StatsLane& lane : header.lanes) {
    out.hits += lane.hits.load(kRelaxed);
    out.misses += lane.misses.load(kRelaxed);
    out.numa_hits += lane.numa_hits.load(kRelaxed);
    out.spill_reads += lane.spill_reads.load(kRelaxed);
  }
  if (single_node) out.numa_hits = out.hits;
  out.reserved_bytes = header.reserved_bytes.load(kRelaxed);
  out.budget_bytes = header.budget_bytes.load(kRelaxed);
  const uint32_t state = header.state.load(kRelaxed);
  out.full = layout::IsFull(state);
  out.spills_now = layout::SpillsNow(state);
  return out;
}

}  // namespace shmcache
