#include "clients/admin/stop_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "common/instance_lock.h"
#include "common/process_state.h"
#include "format/instance.h"
#include "shmcache/client.h"

namespace shmcache::admin {

namespace {

constexpr auto kExitBound = std::chrono::seconds(30);

// Waits until the server process is gone, so that a --start right after
// --stop finds the instance free.
Status WaitForExit(const ProcessHandle& server) {
  if (server.WaitGone(kExitBound)) return Status::OK();
  return Status::Unavailable(
      fmt::format("the cache server (process id {}) did not exit within {} s; end it "
                  "with 'kill -9 {}'",
                  server.pid(), kExitBound.count(), server.pid()));
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

// Stops a server that holds the lock at `lock_path` but does not answer
// (yet, or ever: its socket is gone).
Status StopUnansweringServer(int pid, const std::string& lock_path, StopResult* out) {
  // Opened before the process is looked at, and checked alive after: what
  // /proc said was about this process, not one given its pid later.
  ProcessHandle server(pid);
  if (pid == 0 || !IsOurDaemon(pid) || server.Gone()) {
    return Status::Unavailable(
        fmt::format("a process holds {} but the process id in it ({}) is not a cache "
                    "server of yours; try again in a moment",
                    lock_path, pid));
  }
  if (int err = server.Signal(SIGTERM); err != 0) {
    return Status::FromErrno(fmt::format("cannot signal process {}", pid), err);
  }
  out->pid = pid;
  return WaitForExit(server);
}

// Whether two paths name one directory (the same text where either is
// gone).
bool SameDir(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (stat(a.c_str(), &sa) != 0 || stat(b.c_str(), &sb) != 0) return a == b;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Adds to *out the regular files of this user named with `prefix` in
// `dir` (never through a link) and the bytes they hold.
void CountLeftFiles(const std::string& dir, const std::string& prefix, StopResult* out) {
  // O_NOFOLLOW: the huge-page dir is a name in /dev/shm, open to all.
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return;
  }
  int files = 0;
  for (dirent* e = readdir(d); e != nullptr; e = readdir(d)) {
    struct stat st {};
    if (std::string_view(e->d_name).rfind(prefix, 0) != 0 ||
        fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
      continue;
    }
    ++files;
    out->left_bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  closedir(d);
  if (files == 0) return;
  out->left_files += files;
  out->left_in += (out->left_in.empty() ? "" : " and ") + dir;
}

}  // namespace

Status StopServer(const ClientOptions& co, const std::string& shm_dir, StopResult* out) {
  std::unique_ptr<Client> client;
  Status s = Client::Connect(co, &client);
  if (s.ok()) {
    ServerInfo info;
    s = client->GetServerInfo(&info);
    if (!s.ok()) return s;
    // Held before the stop is asked for: once the server has exited, its
    // pid may be another process's.
    ProcessHandle server(info.pid);
    s = client->StopServer();
    if (!s.ok()) return s;
    client.reset();
    out->pid = info.pid;
    return WaitForExit(server);
  }
  if (!s.IsUnavailable()) return s;
  // Not answering: maybe still starting.
  InstancePaths paths = MakeInstancePaths(co.port, co.run_dir, shm_dir);
  bool held = false;
  int pid = 0;
  Status probe = ProbeInstanceLock(paths.lock_path, &held, &pid);
  if (!probe.ok()) return probe;
  if (held) {
    out->was_starting = true;
    return StopUnansweringServer(pid, paths.lock_path, out);
  }
  // A probe that failed finds no holder.
  HostLockHolder other;
  const std::string host_lock = HostLockPath(co.port);
  probe = ProbeHostLock(host_lock, &other);
  if (other.held && !other.run_dir.empty() && SameDir(other.run_dir, paths.run_dir)) {
    // This run dir's server, its socket and lock file removed (by hand, a
    // clean-up of /tmp): only its host lock still names it. Unless one
    // started here after the probe above: then that one is starting.
    probe = ProbeInstanceLock(paths.lock_path, &held, &pid);
    if (!probe.ok()) return probe;
    out->was_starting = held;
    out->run_files_gone = !held;
    out->run_dir = paths.run_dir;
    return held ? StopUnansweringServer(pid, paths.lock_path, out)
                : StopUnansweringServer(other.pid, host_lock, out);
  }
  out->not_running = true;
  out->run_dir = paths.run_dir;
  out->runs_elsewhere = other.held;
  out->other_pid = other.pid;
  out->other_run_dir = other.run_dir;
  // Until it has written its shm dir, any of the files there may be its.
  if (other.held && other.shm_dir.empty()) return Status::OK();
  // The instance's names, as MakeInstancePaths makes them: its prefix
  // without the directory. What is in the running one's shm dir is its own.
  const std::string name = paths.shm_prefix.substr(paths.shm_dir.size() + 1);
  const auto count = [&](const std::string& dir) {
    if (!other.held || !SameDir(dir, other.shm_dir)) CountLeftFiles(dir, name, out);
  };
  count(paths.shm_dir);
  if (HugeShmDir(co.port) != paths.shm_dir) count(HugeShmDir(co.port));
  return Status::OK();
}

}  // namespace shmcache::admin
