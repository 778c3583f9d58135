// Prometheus text exposition (format 0.0.4) of one server's statistics:
// what `shmcache --metrics` prints, and what the daemon writes to
// --metrics_file for node_exporter's textfile collector.
//
// Every series carries the instance's `port` label; per-cache series also
// `session`, `cache` (its name) and `cache_id`. Server series:
//   shmcache_server_info{shm_dir,spill_dir,version} 1
//   shmcache_server_memory_used_bytes, shmcache_server_memory_cap_bytes,
//   shmcache_server_memory_held_bytes (part of used: destroyed sessions'
//   memory that processes still map),
//   shmcache_server_memory_cap_bound_bytes{bound} (each bound the cap is
//   the smallest of: physical_memory or memory_cap_mb, cgroup when the
//   cgroup has a limit, shm_filesystem) and
//   shmcache_server_memory_cap_bound_applies{bound} (1 for the one that
//   sets the cap, 0 for the others),
//   shmcache_server_sessions, shmcache_server_caches,
//   shmcache_server_connections, shmcache_server_uptime_seconds,
//   shmcache_server_start_time_seconds
// Per-cache series: one per field of kStatFields (format/stats_fields.h,
// with their help text) that names a metric:
//   shmcache_cache_{memory,disk}_{rows,bytes}, shmcache_cache_hits_total,
//   shmcache_cache_misses_total, shmcache_cache_numa_hits_total,
//   shmcache_cache_puts_full_total, shmcache_cache_spill_reads_total,
//   shmcache_cache_{reserved,budget}_bytes, shmcache_cache_full,
//   shmcache_cache_spills_now
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shmcache/stats.h"

namespace shmcache {

std::string PrometheusText(const ServerInfo& info,
                           const std::vector<SessionInfo>& sessions);

// A label value as the format wants it: backslash, double quote and line
// feed escaped; bytes that are not UTF-8 become U+FFFD (the format requires
// UTF-8, and a cache name is any bytes).
std::string PrometheusLabelValue(std::string_view v);

}  // namespace shmcache
