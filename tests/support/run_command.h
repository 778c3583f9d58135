// Running a program from a test: its output, exit, environment and a bound
// on how long it may take.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace shmcache::test {

// Environment additions: (name, value) pairs that override the inherited
// variables of the same name.
using Env = std::vector<std::pair<std::string, std::string>>;

struct CommandResult {
  int exit_code = -1;            // exit status, or -signal when killed
  bool ran = false;              // false: it could not be started (see err)
  bool timed_out = false;        // killed (exit_code -9) because it ran too long
  std::string out;               // stdout (and stderr, when they were merged)
  std::string err;               // stderr
  std::string Describe() const;  // for failure messages
};

struct RunOptions {
  Env env;
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  int uid = -1;               // >= 0: the child drops to that user (and its group)
  bool merge_stderr = false;  // stderr goes to `out`, interleaved
};

// Runs argv (argv[0] a path) with the current environment plus o.env. When
// it runs past o.timeout it is killed (exit_code -9, timed_out).
CommandResult RunCommand(const std::vector<std::string>& argv, const RunOptions& o);
// The same with a timeout in seconds.
CommandResult RunCommand(const std::vector<std::string>& argv, const Env& env = {},
                         int timeout_s = 60, int uid = -1);

// RunCommand with stdout and stderr merged into *output and environment
// given as "NAME=value" strings. Returns the exit code, 128+signal when a
// signal ended it, or -1 when it could not run or ran past `bound`.
int RunProgram(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               std::string* output,
               std::chrono::milliseconds bound = std::chrono::seconds(60));

}  // namespace shmcache::test
