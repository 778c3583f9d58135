// Starting shmcached: fork, setsid, exec, and wait for the daemon's
// readiness report on a pipe ("NOTE <text>" lines, then "OK <pid> <workers>
// <log path>" or "ERR <why>"), so that a failed start is told here.
#pragma once

#include <string>
#include <vector>

#include "clients/admin/cli_args.h"
#include "shmcache/status.h"

namespace shmcache::admin {

struct StartResult {
  int pid = 0;
  int workers = 0;
  std::string log_path;
  // What the daemon found at start that people should know (caches or rows
  // it discarded, and why), one line each.
  std::vector<std::string> notes;
};

// Where the daemon binary is: $SHMCACHE_DAEMON, beside this executable, the
// build tree, the install prefix, then $PATH.
std::string FindDaemon();

Status StartServer(const CliArgs& args, int port, StartResult* out);

}  // namespace shmcache::admin
