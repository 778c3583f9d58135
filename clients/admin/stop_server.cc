#include "clients/admin/stop_server.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "common/instance_files.h"
#include "common/instance_lock.h"
#include "common/process_identity.h"
#include "common/process_state.h"
#include "common/server_elsewhere.h"
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

// Why the process that `recorded` names, held as `check` found it, is not
// the holder of the lock at `lock_path`: "" when it may be (it is the very
// process that wrote the file, or an older version wrote it without its
// start: then the name and user checks decide, as before).
std::string NotTheWriter(const ProcessIdentity& recorded, const OwnerCheck& check,
                         const std::string& lock_path) {
  std::string found;
  if (recorded.pid == 0) {
    found = "its holder has not written its process id yet";
  } else if (check.verdict == Ownership::kGone) {
    found =
        fmt::format("the process that wrote it (process id {}) has ended", recorded.pid);
  } else if (check.verdict == Ownership::kOtherBoot) {
    found = fmt::format(
        "the process that wrote it (process id {}) ran before this machine last booted",
        recorded.pid);
  } else if (check.verdict == Ownership::kReplaced) {
    found = fmt::format(
        "process id {} in it is no longer the process that wrote it: the writer "
        "started {} clock ticks after boot, the process with that id now at {} (the id "
        "was given again after the writer ended)",
        recorded.pid, recorded.start_ticks, check.found_ticks);
  } else {
    return "";
  }
  // Nobody else takes a lock of this user's: whoever holds it is a server
  // between its flock and its write (instance_lock.h).
  return fmt::format(
      "{} is held, but {}; nothing was signalled. A server that is starting writes its "
      "own id there in a moment: try again",
      lock_path, found);
}

// Stops a server that holds the lock at `lock_path` but does not answer
// (yet, or ever: its socket is gone); `recorded`: what the file names.
Status StopUnansweringServer(const ProcessIdentity& recorded,
                             const std::string& lock_path, StopResult* out) {
  // Opened first, then checked to be the file's writer and looked at in
  // /proc, then signalled: every check is about the process signalled,
  // never one given its pid meanwhile.
  ProcessHandle server(recorded.pid);
  const std::string not_the_writer =
      NotTheWriter(recorded, CheckOwner(server, recorded), lock_path);
  if (!not_the_writer.empty()) return Status::Unavailable(not_the_writer);
  if (!IsOurDaemon(recorded.pid) || server.Gone()) {
    return Status::Unavailable(
        fmt::format("a process holds {} but the process id in it ({}) is not a cache "
                    "server of yours; try again in a moment",
                    lock_path, recorded.pid));
  }
  out->was_suspended = ProcessStopped(recorded.pid);
  if (int err = server.Signal(SIGTERM); err != 0) {
    return Status::FromErrno(fmt::format("cannot signal process {}", recorded.pid), err);
  }
  // A stopped server (SIGSTOP, Ctrl-Z) acts on the SIGTERM once it runs:
  // resumed, it stops, where it would wait out the bound and be named as
  // one that did not exit.
  server.Signal(SIGCONT);
  out->pid = recorded.pid;
  return WaitForExit(server);
}

// Adds to *out the regular files of this user named with `prefix` in
// `dir` and the bytes they hold.
void CountLeftFiles(const std::string& dir, const std::string& prefix, StopResult* out) {
  const InstanceFiles left = CountInstanceFiles(dir, prefix);
  if (left.files == 0) return;
  out->left_files += left.files;
  out->left_bytes += left.bytes;
  out->left_in += (out->left_in.empty() ? "" : " and ") + dir;
}

}  // namespace

Status StopServer(const ClientOptions& co, const std::string& shm_dir, StopResult* out) {
  // Where a killed server's files are counted, refused as --start refuses
  // it (an empty or relative $SHMCACHE_SHM_DIR counted none, or the working
  // directory's).
  Status s = shm_dir.empty() ? CheckShmDirFromEnv(DefaultShmDir()) : Status::OK();
  if (!s.ok()) return s;
  std::unique_ptr<Client> client;
  s = Client::Connect(co, &client);
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
  ProcessIdentity owner;
  Status probe = ProbeInstanceLock(paths.lock_path, &held, &owner);
  if (!probe.ok()) return probe;
  if (held) {
    // One that listened (its host lock says so) is not starting: its socket
    // was removed or replaced since.
    HostLockHolder host;
    if (ProbeHostLock(HostLockPath(co.port), &host).ok() && host.held && host.serving &&
        SameDir(host.run_dir, paths.run_dir)) {
      out->socket_lost = LostSocket(paths.socket_path);
      out->socket_path = paths.socket_path;
    }
    out->was_starting = out->socket_lost.empty();
    return StopUnansweringServer(owner, paths.lock_path, out);
  }
  // A probe that failed finds no holder.
  HostLockHolder other;
  const std::string host_lock = HostLockPath(co.port);
  probe = ProbeHostLock(host_lock, &other);
  if (other.held && !other.run_dir.empty() && SameDir(other.run_dir, paths.run_dir)) {
    // This run dir's server, its socket and lock file removed (by hand, a
    // clean-up of /tmp): only its host lock still names it. Unless one
    // started here after the probe above: then that one is starting.
    probe = ProbeInstanceLock(paths.lock_path, &held, &owner);
    if (!probe.ok()) return probe;
    out->was_starting = held;
    out->run_files_gone = !held;
    out->run_dir = paths.run_dir;
    return held ? StopUnansweringServer(owner, paths.lock_path, out)
                : StopUnansweringServer(other.owner, host_lock, out);
  }
  out->not_running = true;
  out->run_dir = paths.run_dir;
  out->runs_elsewhere = other.held;
  out->other_pid = other.held ? PidStillNamed(other.owner) : 0;
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
