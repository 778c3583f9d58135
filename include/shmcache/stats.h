// Plain result structs of the statistics and listing calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shmcache {

// Counters of one cache, summed over every process that uses it.
struct CacheStats {
  uint32_t session_id = 0;
  uint32_t cache_id = 0;
  std::string name;
  uint64_t mem_rows = 0;    // rows held in shared memory
  uint64_t mem_bytes = 0;   // encoded bytes of those rows
  uint64_t disk_rows = 0;   // rows spilled to disk
  uint64_t disk_bytes = 0;  // encoded bytes of those rows
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t numa_hits = 0;       // hits served from the reader's own NUMA node
  uint64_t reserved_bytes = 0;  // shared memory reserved for the cache
  uint64_t budget_bytes = 0;    // its limit (the server cap when size was 0)
  bool full = false;            // no longer accepts rows
  bool spills_now = false;      // memory budget used up; new rows go to disk
  uint64_t puts_full = 0;       // puts refused because the cache was full
  uint64_t spill_reads = 0;     // spilled rows read back: by the readers
                                // from the spill database (GetStats and
                                // listings), plus, in listings only, those
                                // the daemon read for them since it started
  uint64_t avg_row_bytes() const { return mem_rows ? mem_bytes / mem_rows : 0; }
};

struct SessionInfo {
  uint32_t session_id = 0;
  std::vector<CacheStats> caches;
};

struct ServerInfo {
  std::string instance;  // "port 50052"
  int port = 0;
  std::string socket_path;
  std::string shm_dir;
  bool shm_huge_pages = false;  // the pages of shm_dir are huge
  std::string shm_pages;        // why, e.g. "tmpfs mounted huge=within_size"
  int pid = 0;
  int workers = 0;
  int log_level = 0;
  std::string log_path;
  std::string spill_dir;  // empty = none
  uint64_t memory_cap_bytes = 0;
  uint64_t memory_used_bytes = 0;  // reserved under the cap, held included
  // Part of memory_used_bytes: memory of destroyed sessions that some
  // process still maps (tmpfs frees it only at the last unmap).
  uint64_t memory_held_bytes = 0;
  // The bounds memory_cap_bytes is the smallest of (0: none): what -r of
  // physical memory or --memory_cap_mb asks (memory_requested_bound names
  // which), the same ratio of the cgroup's memory limit, and the room in
  // the shm filesystem. memory_cap_bound names the one that applies:
  // "physical_memory", "memory_cap_mb", "cgroup" or "shm_filesystem".
  uint64_t memory_requested_bytes = 0;
  std::string memory_requested_bound;
  uint64_t memory_cgroup_bytes = 0;
  uint64_t memory_cgroup_limit_bytes = 0;  // the cgroup's limit itself
  uint64_t memory_shm_bytes = 0;
  std::string memory_cap_bound;
  int numa_nodes = 1;
  std::vector<uint32_t> sessions;
  // Operations (metrics).
  uint64_t connections = 0;      // client connections open now
  uint64_t start_time_unix = 0;  // when the daemon started, seconds since 1970
  double uptime_seconds = 0;
};

}  // namespace shmcache
