// Helpers of the reliability suites: a daemon run as a child process with
// private paths, rows that carry a checksum of their content, child
// processes, bounded waits, and memory shared across fork().
//
// Every daemon started here has its own port, run dir, shm dir and log dir,
// and is stopped (or killed) and its files removed when the TestDaemon is
// destroyed. Waits poll a condition with a bound; none sleeps a fixed time
// to let something happen.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <memory>
#include <string>
#include <vector>

#include "shmcache/cache.h"
#include "shmcache/client.h"
#include "shmcache/options.h"
#include "shmcache/row.h"
#include "shmcache/status.h"

namespace shmcache::reltest {

// Built programs (paths set by meson).
std::string DaemonPath();
std::string AdminPath();

// Seconds a bounded stress phase runs: $name if set and positive, else
// `fallback`.
double EnvSeconds(const char* name, double fallback);

// Polls `cond` (every 1 ms) until it holds or `bound` passes. True if it held.
bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds bound);

// A directory made with mkdtemp under `parent`; removed recursively by the
// destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& parent = "/tmp");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void RemoveTree(const std::string& path);

// One shmcached, a child of this process, with private paths.
class TestDaemon {
 public:
  struct Options {
    std::string shm_dir;         // "": a private dir under /dev/shm
    // No --shm_dir (and no $SHMCACHE_SHM_DIR): the daemon picks its own
    // (daemon/huge_tmpfs.h); shm_dir() is then the one it reports, or the
    // one it would mount.
    bool default_shm_dir = false;
    uid_t uid = 0;  // != 0 (root only): the daemon runs as this uid
    std::vector<std::string> extra_env;  // NAME=value for the daemon
    uint64_t memory_cap_mb = 0;  // 0: the daemon's default
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
  // Environment assignments for the admin CLI to reach this instance.
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

// Runs `body` in a forked child, which exits with its return value (and
// never returns into the test framework).
pid_t ForkChild(const std::function<int()>& body);
// Waits (bounded) for `pid` to end; false if it did not (it is left alone).
bool WaitChild(pid_t pid, int* wstatus, std::chrono::milliseconds bound);
// Describes a wait status: "exit 0", "signal 9 (Killed)".
std::string DescribeStatus(int wstatus);

// Runs a program with extra environment, captures stdout+stderr. Returns
// its exit code (-1 when it could not run, 128+sig when signalled).
int RunProgram(const std::vector<std::string>& argv,
               const std::vector<std::string>& env, std::string* output,
               std::chrono::milliseconds bound = std::chrono::seconds(60));

// Anonymous memory shared with forked children, value-initialised. Never
// freed (a few pages per test).
void* MapShared(size_t bytes);
template <typename T>
T* SharedBlock() {
  void* p = MapShared(sizeof(T));
  return new (p) T();
}

// ---- Checked rows --------------------------------------------------------
// Row `id` has three columns: "id" (uint64[1]), "data" (uint8[n], a slice
// of a fixed pseudo-random pool chosen by the id; n and the slice depend on
// id only) and "sum" (uint64[1], a checksum of id and data). Any process
// can rebuild the expected row from the id alone, so every read is checked
// byte for byte.
class RowMaker {
 public:
  // Rows of 8..max_data bytes of data.
  explicit RowMaker(size_t max_data = 8192);
  size_t DataBytes(uint64_t id) const;
  const uint8_t* Data(uint64_t id) const;
  uint64_t Sum(uint64_t id) const;
  // Puts row `id`.
  Status Put(Cache& cache, uint64_t id, bool* inserted = nullptr) const;
  // Checks a whole row read back for `id`. "" when right, else what is
  // wrong.
  std::string Verify(uint64_t id, const RowView& row) const;
  // Checks a projection of {"sum", "data"} in that order.
  std::string VerifyProjection(uint64_t id, const RowView& row) const;
  // Encoded bytes of row `id` (what stats count).
  size_t EncodedBytes(uint64_t id) const;
  size_t max_data() const { return max_data_; }

 private:
  static constexpr size_t kSlots = 4096;
  size_t Slot(uint64_t id) const { return id % kSlots; }
  size_t max_data_;
  std::vector<uint8_t> pool_;
  std::vector<uint32_t> offset_, length_;
  std::vector<uint64_t> slot_sum_;
};

// Checksum of id and data (64-bit, FNV-1a over 8-byte words then a mix).
uint64_t Checksum(uint64_t id, const uint8_t* data, size_t n);

}  // namespace shmcache::reltest
