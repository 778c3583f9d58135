#include "clients/admin/server_elsewhere.h"

#include <sys/stat.h>

#include <fmt/format.h>

#include "common/instance_lock.h"
#include "common/process_identity.h"
#include "common/process_state.h"
#include "format/instance.h"

namespace shmcache::admin {

bool SameDir(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (stat(a.c_str(), &sa) != 0 || stat(b.c_str(), &sb) != 0) return a == b;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

Status ExplainNoServerHere(const ClientOptions& co, const std::string& command,
                           const Status& connect_error) {
  if (!connect_error.IsUnavailable()) return connect_error;
  const InstancePaths here = MakeInstancePaths(co.port, co.run_dir, "");
  // A run dir a start would refuse (a link planted in /tmp, another
  // user's directory): that, not "start it".
  if (Status dir = CheckOwnRunDir(here.run_dir); !dir.ok()) return dir;
  HostLockHolder holder;
  if (!ProbeHostLock(HostLockPath(co.port), &holder).ok() || !holder.held) {
    return connect_error;
  }
  const std::string p = PortArg(co.port);
  const int pid = PidStillNamed(holder.owner);
  const std::string pid_text = pid > 0 ? std::to_string(pid) : "?";
  if (holder.run_dir.empty()) {
    // It writes its run dir just after it takes the lock.
    return Status::Unavailable(fmt::format(
        "no cache server answers on port {} with run dir {}, but one of yours is "
        "starting on that port (it has not written its run dir yet): try again in a "
        "moment",
        co.port, here.run_dir));
  }
  if (SameDir(holder.run_dir, here.run_dir)) {
    if (ProcessStopped(pid)) {
      return Status::Unavailable(fmt::format(
          "the cache server on port {} (process id {}) is stopped (SIGSTOP, Ctrl-Z or a "
          "debugger) and answers nothing: resume it with 'kill -CONT {}', or stop it "
          "with 'shmcache --stop{}'",
          co.port, pid, pid, p));
    }
    struct stat st {};
    // Its socket there, it did not answer in time: the connect's error says so.
    if (lstat(here.socket_path.c_str(), &st) == 0) return connect_error;
    return Status::Unavailable(fmt::format(
        "the cache server on port {} (process id {}) runs with run dir {}, but its "
        "socket {} is gone (removed while it ran, by hand or a clean-up of /tmp): "
        "restart it with 'shmcache --stop{}' and 'shmcache --start{}'",
        co.port, pid_text, here.run_dir, here.socket_path, p, p));
  }
  return Status::Unavailable(fmt::format(
      "no cache server is running on port {} with run dir {}; a server of yours on "
      "port {} runs with run dir {} (process id {}), and a user has one server per "
      "port: ask it with 'SHMCACHE_RUN_DIR={} shmcache {}{}', or stop it with "
      "'SHMCACHE_RUN_DIR={} shmcache --stop{}' before starting one here",
      co.port, here.run_dir, co.port, holder.run_dir, pid_text, holder.run_dir, command,
      p, holder.run_dir, p));
}

}  // namespace shmcache::admin
