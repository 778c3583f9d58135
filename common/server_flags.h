// ServerFlags: the options a server is started with that people give, to
// `shmcache --start` or to shmcached itself. One definition of each flag
// for both binaries: its names, how its value is read (option_checks.h),
// and how the admin hands it on to the daemon it starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/option_checks.h"
#include "shmcache/status.h"

namespace CLI {
class Option;
}

namespace shmcache {

class CommandLine;  // command_line.h

struct ServerFlags {
  int workers = 0;  // 0: half the CPUs; rounded up to the NUMA nodes
  int log_level = 1;
  std::string spill_dir;                             // empty: no spilling
  double memory_cap_ratio = kDefaultMemoryCapRatio;  // of physical memory
  uint64_t memory_cap_bytes = 0;                     // absolute cap; 0: use the ratio
  std::string shm_dir;       // "": $SHMCACHE_SHM_DIR, the server's huge tmpfs or /dev/shm
  std::string log_dir;       // "": <run dir>/log, owner-only
  std::string metrics_file;  // empty: none; else rewritten every interval
  int metrics_interval_s = 5;
  bool metrics_interval_given = false;  // without metrics_file: refused
};

// Adds the flags to `cl`, each stored in *flags as it is read:
//   -w,--workers  -s,--spilldir  -l,--loglevel  -r,--memory_cap_ratio
//   --memory_cap_mb  --shm_dir  --log_dir  --metrics_file  --metrics_interval
// Returns them. REQUIRES: *flags outlives cl.Parse().
std::vector<CLI::Option*> AddServerFlags(CommandLine& cl, ServerFlags* flags);

// The flags of `given` (returned by AddServerFlags) that were given, as
// "--name=value" for the daemon, with the value as written.
std::vector<std::string> ServerFlagArgs(const std::vector<CLI::Option*>& given);

// The checks of flags that look at the machine or at each other: memory
// cap at least one segment, spill dir and metrics file usable, no
// --metrics_interval without a --metrics_file (it would be ignored). Run by
// the admin before it starts a server, and by the server before it makes
// anything.
Status CheckServerFlags(const ServerFlags& flags);

}  // namespace shmcache
