// TestServer: a private shmcached started and stopped through the real
// admin binary, as users do (TestDaemon, test_daemon.h, runs one as a child
// of the test instead). This header also brings the helpers every suite
// uses: commands, files, children, bounded waits, row patterns.
//
// Every TestServer has its own run dir (socket, lock, log) and its own shm
// dir (a fresh directory under /dev/shm), so tests never meet each other's
// daemons or segments, and the destructor can assert that --stop left
// nothing behind.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shmcache/client.h"
#include "shmcache/options.h"
#include "shmcache/status.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"
#include "tests/support/row_pattern.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {

struct ServerOptions {
  int port = 0;                         // 0: pick a free one
  std::string run_dir;                  // "": a private temp dir (removed at the end)
  std::string shm_dir;                  // "": a private dir under /dev/shm (removed)
  std::vector<std::string> extra_args;  // e.g. {"-w", "2"}
  bool default_log_dir = false;  // false: logs in <run dir>/log, given as --log_dir
  Env env;                       // for the admin and the daemon it starts
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
