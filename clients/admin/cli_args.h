// CliArgs: the admin command line, parsed and checked. One command per
// call; every problem becomes a one-line message naming what was wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/server_flags.h"
#include "shmcache/status.h"

namespace shmcache::admin {

enum class Command {
  kNone,
  kStart,
  kStop,
  kGenerate,
  kDestroy,
  kList,
  kInfo,
  kMetrics,
  kHelp,
  kVersion
};

struct CliArgs {
  Command command = Command::kNone;
  uint32_t session_id = 0;  // -d
  int port = 0;             // 0: $SHMCACHE_PORT or the default
  std::string hostname;
  bool json = false;
  ServerFlags server;  // --start: the server's options
  // The server options given, as shmcached takes them ("--workers=3").
  std::vector<std::string> server_args;
};

// argv[0] is skipped. InvalidArgument with the message to print.
Status ParseCliArgs(const std::vector<std::string>& argv, CliArgs* out);

const char* UsageText();

}  // namespace shmcache::admin
