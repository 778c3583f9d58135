// TestDaemon: one shmcached run as a child of the test (--foreground, its
// readiness read from a pipe), for the suites that kill, restart, limit or
// run it as another user; TestServer (test_server.h) starts one through the
// admin instead, as users do. This header also brings the helpers the
// suites that use it need: children, files, commands, bounded waits.
//
// Every daemon started here has its own port, run dir, shm dir and log dir,
// and is stopped (or killed) and its files removed when the TestDaemon is
// destroyed. It watches the process that started it (--watch_pid), and
// stops by itself when that process dies without destroying it (a crash, a
// kill on timeout), even if it was stopped (SIGSTOP) then.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shmcache/cache.h"
#include "shmcache/client.h"
#include "shmcache/options.h"
#include "shmcache/status.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {

// One shmcached, a child of this process, with private paths.
class TestDaemon {
 public:
  struct Options {
    std::string shm_dir;  // "": a private dir under /dev/shm
    // No --shm_dir (and no $SHMCACHE_SHM_DIR): the daemon picks its own
    // (daemon/huge_tmpfs.h); shm_dir() is then the one it reports, or the
    // one it would mount.
    bool default_shm_dir = false;
    uid_t uid = 0;                       // != 0 (root only): the daemon runs as this uid
    std::vector<std::string> extra_env;  // NAME=value for the daemon
    uint64_t memory_cap_mb = 0;          // 0: the daemon's default
    int workers = 2;
    int fd_limit = 0;  // > 0: RLIMIT_NOFILE, soft and hard, of the daemon
    std::vector<std::string> extra_args;  // more --name=value options
  };
  TestDaemon();
  ~TestDaemon();  // Kill() if still running; removes its files.

  // Starts it and waits (bounded) for its readiness line.
  Status Start(const Options& o);
  Status Start() { return Start(Options{}); }
  // Restarts on the same port and paths (after Kill or Stop).
  Status Restart();
  // SIGKILL and reap.
  void Kill();
  // Asks it to stop; reaps it (bounded). Kills it if it does not exit.
  Status Stop();
  // True while the process exists and has not been reaped.
  bool Alive();

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& run_dir() const { return run_dir_; }
  const std::string& shm_dir() const { return shm_dir_; }
  const std::string& log_dir() const { return log_dir_; }
  std::string shm_prefix() const;
  ClientOptions client_options() const;
  // Whether the daemon's huge-page tmpfs is mounted (HugeShmDir).
  bool HugeMounted() const;
  // Files of this instance in its shm dir.
  std::vector<std::string> ShmFiles() const;
  // The daemon's log (all files in its log dir, concatenated).
  std::string ReadLog() const;
  // Environment assignments for the admin CLI to reach this instance; a
  // server it starts with them watches this process too.
  std::vector<std::string> AdminEnv() const;

 private:
  Status Spawn();
  Options opts_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::string run_dir_, shm_dir_, log_dir_, base_dir_;
  bool own_shm_dir_ = false;
};

// A client of `d`, a new session, and one cache (fingerprint `fingerprint`)
// in it: the start of most tests.
struct SessionCache {
  std::unique_ptr<Client> client;
  uint32_t session = 0;
  std::unique_ptr<Cache> cache;
};
Status OpenSessionCache(const TestDaemon& d, const std::string& fingerprint,
                        SessionCache* out);

// Whether `uid` can execute `path`: a build tree under a 0700 directory (a
// private checkout, a clone made in mktemp -d) is out of another user's
// reach, and then a server cannot run as that user from it.
bool RunnableBy(uid_t uid, const std::string& path);

}  // namespace shmcache::test
