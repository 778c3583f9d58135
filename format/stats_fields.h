// Every field of CacheStats, described once: how it travels in a listing
// (ListSessionsResponse, protocol_messages.h) and its name in every place
// that shows it: the Python dict (DatasetCache.stats(), the native
// list_sessions), the JSON and the table of `shmcache --list_sessions`, and
// the Prometheus metrics (common/metrics.h). Each of those visits
// kStatFields; a field added here appears in all of them.
//
// The wire fields travel in the order of this table: a new one is appended
// (after the last wire field) with a new protocol version (protocol.h).
// tests/stats_fields_test.cc checks the names; protocol_golden_test.cc the
// bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "shmcache/stats.h"

namespace shmcache {

// Fields in the order a row of the table reads (a few dozen bytes of
// padding in a table of 17 rows).
// NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding)
struct StatField {
  enum class Type : uint8_t {
    kId,       // uint32_t
    kText,     // std::string
    kCount,    // uint64_t (a counter or a gauge)
    kFlag,     // bool: 0 or 1 as a number
    kDerived,  // a number computed from the others; never on the wire
  };
  std::string_view name;  // the C++ member, and the Python dict's key
  Type type = Type::kCount;
  uint32_t CacheStats::*id = nullptr;
  std::string CacheStats::*text = nullptr;
  uint64_t CacheStats::*count = nullptr;
  bool CacheStats::*flag = nullptr;
  uint64_t (*derived)(const CacheStats&) = nullptr;
  bool wire = true;         // in a listing's cache entries
  std::string_view json;    // key in --list_sessions --json; "": absent
  std::string_view metric;  // Prometheus family; "": none (labels are by hand)
  bool counter = false;     // the family's TYPE: counter, else gauge
  std::string_view help;    // the family's HELP
  int column = 0;           // position in the --list_sessions table (1...);
                            // 0: absent
  std::string_view title;   // its column title
  int width = 0;            // its column width, the title's gap included

  bool number() const {
    return type == Type::kCount || type == Type::kFlag || type == Type::kDerived;
  }
  // A number's value (a flag: 0 or 1). REQUIRES: number().
  uint64_t Number(const CacheStats& c) const {
    switch (type) {
      case Type::kCount: return c.*count;
      case Type::kFlag: return c.*flag ? 1 : 0;
      case Type::kDerived: return derived(c);
      default: return 0;
    }
  }
};

using StatType = StatField::Type;

// In wire order (the fields with `wire`).
inline constexpr StatField kStatFields[] = {
    {.name = "session_id",
     .type = StatType::kId,
     .id = &CacheStats::session_id,
     .wire = false},  // its session's, in a listing
    {.name = "cache_id",
     .type = StatType::kId,
     .id = &CacheStats::cache_id,
     .json = "cache_id",
     .column = 1,
     .title = "Cache Id",
     .width = 12},
    // Last in the table: a name has up to 255 bytes, so its column is as
    // wide as it is, after a gap of two.
    {.name = "name",
     .type = StatType::kText,
     .text = &CacheStats::name,
     .json = "name",
     .column = 9,
     .title = "Name",
     .width = 6},
    {.name = "mem_rows",
     .count = &CacheStats::mem_rows,
     .json = "mem_cached",
     .metric = "shmcache_cache_memory_rows",
     .help = "Rows held in shared memory.",
     .column = 2,
     .title = "Mem cached",
     .width = 12},
    {.name = "mem_bytes",
     .count = &CacheStats::mem_bytes,
     .json = "mem_bytes",
     .metric = "shmcache_cache_memory_bytes",
     .help = "Encoded bytes of the rows held in shared memory."},
    {.name = "disk_rows",
     .count = &CacheStats::disk_rows,
     .json = "disk_cached",
     .metric = "shmcache_cache_disk_rows",
     .help = "Rows spilled to disk.",
     .column = 3,
     .title = "Disk cached",
     .width = 13},
    {.name = "avg_row_bytes",
     .type = StatType::kDerived,
     .derived = [](const CacheStats& c) { return c.avg_row_bytes(); },
     .wire = false,
     .json = "avg_cache_size",
     .column = 4,
     .title = "Avg cache size",
     .width = 16},
    {.name = "hits",
     .count = &CacheStats::hits,
     .json = "hits",
     .metric = "shmcache_cache_hits_total",
     .counter = true,
     .help = "Reads that found their row.",
     .column = 6,
     .title = "Hits",
     .width = 12},
    {.name = "misses",
     .count = &CacheStats::misses,
     .json = "misses",
     .metric = "shmcache_cache_misses_total",
     .counter = true,
     .help = "Reads that did not find their row.",
     .column = 7,
     .title = "Misses",
     .width = 12},
    {.name = "numa_hits",
     .count = &CacheStats::numa_hits,
     .json = "numa_hit",
     .metric = "shmcache_cache_numa_hits_total",
     .counter = true,
     .help = "Hits served from the reader's own NUMA node.",
     .column = 5,
     .title = "Numa hit",
     .width = 10},
    {.name = "reserved_bytes",
     .count = &CacheStats::reserved_bytes,
     .json = "reserved_bytes",
     .metric = "shmcache_cache_reserved_bytes",
     .help = "Shared memory reserved for the cache (segments and index)."},
    {.name = "budget_bytes",
     .count = &CacheStats::budget_bytes,
     .json = "budget_bytes",
     .metric = "shmcache_cache_budget_bytes",
     .help = "The cache's memory budget."},
    {.name = "full",
     .type = StatType::kFlag,
     .flag = &CacheStats::full,
     .json = "full",
     .metric = "shmcache_cache_full",
     .help = "1 when the cache no longer accepts rows.",
     .column = 8,
     .title = "Full",
     .width = 6},
    {.name = "disk_bytes",
     .count = &CacheStats::disk_bytes,
     .json = "disk_bytes",
     .metric = "shmcache_cache_disk_bytes",
     .help = "Encoded bytes of the rows spilled to disk."},
    {.name = "puts_full",
     .count = &CacheStats::puts_full,
     .json = "puts_full",
     .metric = "shmcache_cache_puts_full_total",
     .counter = true,
     .help = "Puts dropped because the cache was full."},
    {.name = "spill_reads",
     .count = &CacheStats::spill_reads,
     .json = "spill_reads",
     .metric = "shmcache_cache_spill_reads_total",
     .counter = true,
     .help = "Spilled rows read back from disk (since the server started)."},
    {.name = "spills_now",
     .type = StatType::kFlag,
     .flag = &CacheStats::spills_now,
     .json = "spills_now",
     .metric = "shmcache_cache_spills_now",
     .help = "1 when the cache's memory is used up and new rows go to disk."},
};

// Reads or writes the wire fields of `c` in order through `io`, a
// protocol::FieldWriter or FieldReader (protocol_fields.h).
template <typename Stats, typename IO>
void StatWireFields(Stats& c, IO& io) {
  for (const StatField& f : kStatFields) {
    if (!f.wire) continue;
    switch (f.type) {
      case StatType::kId: io.U32(c.*f.id); break;
      case StatType::kText: io.Str(c.*f.text); break;
      case StatType::kCount: io.U64(c.*f.count); break;
      case StatType::kFlag: io.Flag(c.*f.flag); break;
      case StatType::kDerived: break;
    }
  }
}

}  // namespace shmcache
