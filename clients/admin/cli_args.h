// CliArgs: the admin command line, parsed and checked. One command per
// call; every problem becomes a one-line message naming what was wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shmcache/status.h"

namespace shmcache::admin {

enum class Command {
  kNone, kStart, kStop, kGenerate, kDestroy, kList, kInfo, kMetrics, kHelp
};

struct CliArgs {
  Command command = Command::kNone;
  uint32_t session_id = 0;       // -d
  int port = 0;                  // 0: $SHMCACHE_PORT or the default
  std::string hostname;
  int workers = 0;               // --start: 0 = half the CPUs
  std::string spill_dir;
  int log_level = 1;
  double memory_cap_ratio = 0;   // 0: the server's default (0.8)
  uint64_t memory_cap_mb = 0;
  std::string shm_dir;
  std::string log_dir;
  bool json = false;
  std::string metrics_file;  // --start: rewrite Prometheus metrics there
  int metrics_interval = 0;  // seconds; 0: the server's default (5)
};

// argv[0] is skipped. InvalidArgument with the message to print.
Status ParseCliArgs(const std::vector<std::string>& argv, CliArgs* out);

const char* UsageText();

}  // namespace shmcache::admin
