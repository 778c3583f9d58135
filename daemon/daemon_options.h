// DaemonOptions: what shmcached runs with. The flags people give are
// ServerFlags (common/server_flags.h), read and checked as the admin reads
// them; the admin passes them on as --name=value. The daemon re-checks
// every value, so it is safe to start by hand too.
#pragma once

#include <cstdint>
#include <string>

#include "common/server_flags.h"
#include "shmcache/status.h"

namespace shmcache {

struct DaemonOptions : ServerFlags {
  int port = 50052;
  std::string run_dir;  // default: DefaultRunDir()
  int ready_fd = -1;    // pipe to the admin: one line "OK ..."/"ERR ..."
  int watch_pid = 0;    // > 0: stop (cleanly) once this process is gone
  bool foreground = false;
  bool version = false;  // --version: print the version, start nothing
  // A connection that stops in the middle of a frame (part of a request
  // sent, or a response not taken) for this long is closed. Connections
  // idle between frames are never timed out.
  int stall_timeout_ms = 30000;
  // Request bodies being read, all connections together; a connection
  // that would pass it is closed.
  uint64_t body_bytes_cap = 256u << 20;
};

// Parses shmcached's own argv: the ServerFlags, then --port, --run_dir,
// --ready_fd, --watch_pid, --foreground and, for tests, --stall_timeout_ms
// and --body_bytes_cap_mb; or --version alone. InvalidArgument names the bad
// argument.
Status ParseDaemonOptions(int argc, char** argv, DaemonOptions* out);

}  // namespace shmcache
