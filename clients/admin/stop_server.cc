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

// Stops a server that holds the instance lock but does not answer yet.
Status StopStartingServer(int pid, const std::string& lock_path, StopResult* out) {
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
  out->was_starting = true;
  return WaitForExit(server);
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
  if (!held) {  // nobody holds the lock: not running
    out->not_running = true;
    out->run_dir = paths.run_dir;
    probe = ProbeHostLock(HostLockPath(co.port), &out->runs_elsewhere, &out->other_pid,
                          &out->other_run_dir);
    // Running under another run dir: what is in the shm dir is its own. (A
    // probe that failed found no holder: runs_elsewhere stays false.)
    if (probe.ok() && out->runs_elsewhere) return Status::OK();
    // The instance's names, as MakeInstancePaths makes them: its prefix
    // without the directory.
    const std::string name = paths.shm_prefix.substr(paths.shm_dir.size() + 1);
    CountLeftFiles(paths.shm_dir, name, out);
    if (HugeShmDir(co.port) != paths.shm_dir) {
      CountLeftFiles(HugeShmDir(co.port), name, out);
    }
    return Status::OK();
  }
  return StopStartingServer(pid, paths.lock_path, out);
}

}  // namespace shmcache::admin
