// Test helpers: running commands, temporary directories, forked children,
// bounded waits, and TestServer, a private shmcached started and stopped
// through the real admin binary.
//
// Every TestServer has its own run dir (socket, lock, log) and its own shm
// dir (a fresh directory under /dev/shm), so tests never meet each other's
// daemons or segments, and the destructor can assert that --stop left
// nothing behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shmcache/client.h"
#include "shmcache/options.h"
#include "shmcache/status.h"

namespace shmcache::test {

using Env = std::vector<std::pair<std::string, std::string>>;

struct CommandResult {
  int exit_code = -1;  // exit status, or -signal when killed
  std::string out;     // stdout
  std::string err;     // stderr
  std::string Describe() const;  // for failure messages
};

// Runs argv (argv[0] a path) with the current environment plus `env`, and
// waits at most timeout_s (then kills it and reports exit_code -9).
// uid >= 0: the child drops to that user (and its group) before exec.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         const Env& env = {}, int timeout_s = 60,
                         int uid = -1);

// Paths of the binaries under test, from the environment meson sets.
std::string AdminPath();   // $SHMCACHE_ADMIN
std::string DaemonPath();  // $SHMCACHE_DAEMON_BIN

// A fresh directory named parent/prefix.XXXXXX.
std::string MakeTempDir(const std::string& parent, const std::string& prefix);
// Base for test run dirs: $SHMCACHE_RUN_DIR (scripts/test.sh), else /tmp.
std::string TestTmpRoot();
void RemoveTree(const std::string& dir);
// Names (not paths) in dir, sorted; empty when it does not exist.
std::vector<std::string> ListDir(const std::string& dir);
bool PathExists(const std::string& path);

// Polls cond every millisecond or so until it holds or `bound` passes.
bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds bound = std::chrono::seconds(20));

// Forks; the child runs body and _exits with its result (exceptions and
// gtest are not used in children). Returns the child's pid.
pid_t ForkChild(const std::function<int()>& body);
// Waits at most timeout_s for the child; returns its exit code, -signal
// when it was killed, or -9 after killing it on timeout.
int WaitChild(pid_t pid, int timeout_s = 60);

// True once pid is gone or a zombie (it exited; the reaper may be slow).
bool ProcessExited(pid_t pid);

// A deterministic byte pattern for row `id` (salt tells writers apart).
void FillPattern(uint64_t id, uint64_t salt, void* dst, size_t n);
std::vector<uint8_t> Pattern(uint64_t id, uint64_t salt, size_t n);

struct ServerOptions {
  int port = 0;             // 0: pick a free one
  std::string run_dir;      // "": a private temp dir (removed at the end)
  std::string shm_dir;      // "": a private dir under /dev/shm (removed)
  std::vector<std::string> extra_args;  // e.g. {"-w", "2"}
  Env env;                  // for the admin and the daemon it starts
};

class TestServer;

// Options of a server started with extra admin arguments.
ServerOptions WithArgs(std::vector<std::string> args);
// Options for a second daemon on the instance `first` ran (same port, run
// dir and shm dir): how a restart after a crash looks.
ServerOptions SameInstance(const TestServer& first, std::vector<std::string> args);
// A cache named `name` with fingerprint "<name>-fp".
CacheOptions CacheNamed(uint32_t session, const std::string& name, uint64_t size_mb,
                        bool spilling);

class TestServer {
 public:
  // Starts the daemon; check ok() (the start output is in start_result()).
  explicit TestServer(ServerOptions options = {});
  // Stops the daemon with --stop (unless Stop/Kill ran) and asserts that
  // its shm dir holds none of its files and its socket is gone.
  ~TestServer();
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

  bool ok() const { return start_.exit_code == 0 && pid_ > 0; }
  const CommandResult& start_result() const { return start_; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& run_dir() const { return run_dir_; }
  const std::string& shm_dir() const { return shm_dir_; }
  std::string socket_path() const;
  // Prefix (a name in shm_dir) of this instance's files.
  std::string shm_prefix() const;
  // Names in shm_dir that belong to this instance.
  std::vector<std::string> ShmFiles() const;
  // Everything in the log dir of the run dir (the default log dir).
  std::string ReadLog() const;
  // Environment for an admin run against this server.
  Env AdminEnv() const;

  ClientOptions client_options() const;
  Status Connect(std::unique_ptr<Client>* out) const;
  // Creates a session through a short-lived client.
  uint32_t NewSession() const;

  // Runs the admin with args plus "-p PORT".
  CommandResult Admin(std::vector<std::string> args) const;
  // --stop; returns its result. Afterwards the destructor only checks.
  CommandResult Stop();
  // SIGKILL, then waits until the daemon is dead. The destructor then
  // removes what it left instead of asserting.
  void Kill();

 private:
  ServerOptions options_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::string run_dir_, shm_dir_;
  bool own_run_dir_ = false, own_shm_dir_ = false;
  bool stopped_ = false, killed_ = false;
  CommandResult start_;
};

}  // namespace shmcache::test
