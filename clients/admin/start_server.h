// Starting shmcached: fork, setsid, exec, and wait for the daemon's one-line
// readiness report on a pipe, so that a failed start is told here.
#pragma once

#include <string>

#include "cli_args.h"
#include "shmcache/status.h"

namespace shmcache::admin {

struct StartResult {
  int pid = 0;
  int workers = 0;
  std::string log_path;
};

// Where the daemon binary is: $SHMCACHE_DAEMON, beside this executable, the
// build tree, the install prefix, then $PATH.
std::string FindDaemon();

Status StartServer(const CliArgs& args, int port, StartResult* out);

}  // namespace shmcache::admin
