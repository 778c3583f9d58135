// DaemonOptions: what shmcached runs with. The admin CLI validates user
// input and passes these as --name=value; Parse() re-checks every value, so
// the daemon is safe to start by hand too.
#pragma once

#include <cstdint>
#include <string>

#include "shmcache/status.h"

namespace shmcache {

struct DaemonOptions {
  int port = 50052;
  std::string run_dir;   // default: DefaultRunDir()
  std::string shm_dir;   // "": ChooseShmDir (huge_tmpfs.h) unless $SHMCACHE_SHM_DIR
  std::string log_dir;    // default: <run dir>/log, owner-only
  int workers = 0;       // 0: half the CPUs; rounded up to the NUMA nodes
  int log_level = 1;
  std::string spill_dir;  // empty: no spilling
  double memory_cap_ratio = 0.8;   // of physical memory
  uint64_t memory_cap_bytes = 0;   // absolute cap; 0: use the ratio
  int ready_fd = -1;     // pipe to the admin: one line "OK ..."/"ERR ..."
  int watch_pid = 0;     // > 0: stop (cleanly) once this process is gone
  bool foreground = false;
  // A connection that stops in the middle of a frame (part of a request
  // sent, or a response not taken) for this long is closed. Connections
  // idle between frames are never timed out.
  int stall_timeout_ms = 30000;
  // Request bodies being read, all connections together; a connection
  // that would pass it is closed.
  uint64_t body_bytes_cap = 256u << 20;
  std::string metrics_file;  // empty: none; else rewritten every interval
  int metrics_interval_s = 5;
};

// Parses shmcached's own argv. InvalidArgument names the bad argument.
Status ParseDaemonOptions(int argc, char** argv, DaemonOptions* out);

// Checks a spill dir: absolute, an existing directory, writable.
Status CheckSpillDir(const std::string& dir);

// The cap of all caches together: cap_bytes when not 0, else `ratio` of
// physical memory.
uint64_t MemoryCapBytes(double ratio, uint64_t cap_bytes);
// InvalidArgument, naming the option and its minimum, when that cap is
// below one segment (CacheState::kMinSegmentBytes): no cache could hold a row.
Status CheckMemoryCap(double ratio, uint64_t cap_bytes);
// Checks that `path` can be the metrics file (MetricsFile): absolute, not
// a directory, in an existing directory this user may write. Here rather
// than in metrics_file.cc so that the admin, which checks --metrics_file
// before it starts the server, does not link the daemon's Store.
Status CheckMetricsFile(const std::string& path);

}  // namespace shmcache
