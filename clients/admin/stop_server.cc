#include "stop_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "instance.h"
#include "parse_number.h"
#include "process_state.h"
#include "shmcache/client.h"

namespace shmcache::admin {

namespace {

constexpr auto kExitBound = std::chrono::seconds(30);

// Waits until the server process is gone, so that a --start right after
// --stop finds the instance free.
Status WaitForExit(int pid) {
  auto deadline = std::chrono::steady_clock::now() + kExitBound;
  while (!ProcessGone(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Unavailable(
          fmt::format("the cache server (process id {}) did not exit within {} s; end it "
                      "with 'kill -9 {}'",
                      pid, kExitBound.count(), pid));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::OK();
}

// Whether `pid` is a shmcached running as this user.
bool IsOurDaemon(int pid) {
  std::ifstream comm(fmt::format("/proc/{}/comm", pid));
  std::string name;
  if (!std::getline(comm, name) || name != "shmcached") return false;
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    unsigned long real = 0, effective = 0;
    if (std::sscanf(line.c_str(), "Uid: %lu %lu", &real, &effective) == 2) {
      return effective == geteuid();
    }
  }
  return false;
}

// The process holding the instance lock: *pid, or 0 when none holds it.
// An error when one holds it but the pid it wrote is not our shmcached
// (it has only just taken the lock, or the file was tampered with).
Status LockHolder(const std::string& lock_path, int* pid) {
  *pid = 0;
  int fd = open(lock_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::FromErrno("cannot open " + lock_path, errno);
  }
  // A shared lock is granted only while no server holds the exclusive one;
  // closing the file drops it again.
  if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
    close(fd);
    return Status::OK();
  }
  char buf[32] = {};
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  close(fd);
  long named = 0;
  if (n > 0) LeadingLong(buf, &named);
  if (named <= 0 || named > INT32_MAX || !IsOurDaemon(static_cast<int>(named))) {
    return Status::Unavailable(
        fmt::format("a process holds {} but the process id in it ({}) is not a cache "
                    "server of yours; try again in a moment",
                    lock_path, named));
  }
  *pid = static_cast<int>(named);
  return Status::OK();
}

}  // namespace

Status StopServer(const ClientOptions& co, StopResult* out) {
  std::unique_ptr<Client> client;
  Status s = Client::Connect(co, &client);
  if (s.ok()) {
    ServerInfo info;
    s = client->GetServerInfo(&info);
    if (s.ok()) s = client->StopServer();
    if (!s.ok()) return s;
    client.reset();
    out->pid = info.pid;
    return WaitForExit(info.pid);
  }
  if (!s.IsUnavailable()) return s;
  // Not answering: maybe still starting.
  InstancePaths paths = MakeInstancePaths(co.port, co.run_dir, "");
  int pid = 0;
  Status held = LockHolder(paths.lock_path, &pid);
  if (!held.ok()) return held;
  if (pid == 0) return s;  // nobody holds the lock: not running
  if (kill(pid, SIGTERM) != 0) {
    return Status::FromErrno(fmt::format("cannot signal process {}", pid), errno);
  }
  out->pid = pid;
  out->was_starting = true;
  return WaitForExit(pid);
}

}  // namespace shmcache::admin
