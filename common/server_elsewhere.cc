#include "common/server_elsewhere.h"

#include <sys/stat.h>

#include <fmt/format.h>

#include "common/instance_lock.h"
#include "common/process_identity.h"
#include "common/process_state.h"
#include "format/instance.h"
#include "format/shell_quote.h"

namespace shmcache {

bool SameDir(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (stat(a.c_str(), &sa) != 0 || stat(b.c_str(), &sb) != 0) return a == b;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

std::string LostSocket(const std::string& socket_path) {
  struct stat st {};
  if (lstat(socket_path.c_str(), &st) != 0) return "removed";
  if (S_ISSOCK(st.st_mode)) return "";
  if (S_ISREG(st.st_mode)) return "replaced by a regular file";
  if (S_ISFIFO(st.st_mode)) return "replaced by a FIFO";
  if (S_ISDIR(st.st_mode)) return "replaced by a directory";
  if (S_ISLNK(st.st_mode)) return "replaced by a symbolic link";
  return "replaced by something else";
}

Status ExplainNoServerHere(int port, const std::string& run_dir,
                           const std::string& command, const Status& connect_error) {
  if (!connect_error.IsUnavailable()) return connect_error;
  const InstancePaths here = MakeInstancePaths(port, run_dir, "");
  // A run dir a start would refuse (a link planted in /tmp, another
  // user's directory): that, not "start it". Still Unavailable: what a
  // connect's caller acts on (a trainer degrades, --stop looks further).
  if (Status dir = CheckOwnRunDir(here.run_dir); !dir.ok()) {
    return Status::Unavailable(dir.message());
  }
  HostLockHolder holder;
  if (!ProbeHostLock(HostLockPath(port), &holder).ok() || !holder.held) {
    return connect_error;
  }
  const std::string p = PortArg(port);
  const int pid = PidStillNamed(holder.owner);
  const std::string pid_text = pid > 0 ? std::to_string(pid) : "?";
  if (holder.run_dir.empty()) {
    // It writes its run dir just after it takes the lock.
    return Status::Unavailable(fmt::format(
        "no cache server answers on port {} with run dir {}, but one of yours is "
        "starting on that port (it has not written its run dir yet): try again in a "
        "moment",
        port, here.run_dir));
  }
  if (SameDir(holder.run_dir, here.run_dir)) {
    if (ProcessStopped(pid)) {
      return Status::Unavailable(fmt::format(
          "the cache server on port {} (process id {}) is stopped (SIGSTOP, Ctrl-Z or a "
          "debugger) and answers nothing: resume it with 'kill -CONT {}', or stop it "
          "with 'shmcache --stop{}'",
          port, pid, pid, p));
    }
    if (!holder.serving) {
      // It listens once its shared memory is set up (adopting a large
      // earlier state takes a while); until then its socket is missing, or
      // a killed server's is there. Told "its socket is gone: restart it"
      // or "not running" before.
      return Status::Unavailable(fmt::format(
          "the cache server on port {} (process id {}) is still starting with run dir "
          "{} (it listens on {} once it has set up its shared memory): try again in a "
          "moment",
          port, pid_text, here.run_dir, here.socket_path));
    }
    const std::string lost = LostSocket(here.socket_path);
    // Its socket there, it did not answer in time: the connect's error says so.
    if (lost.empty()) return connect_error;
    // Something else at its name (put there by hand, or a clean-up and a
    // neighbour's file) refuses the connect: "not running; start it" was
    // said, and that start is refused.
    const std::string what = lost == "removed"
                                 ? "is gone (removed while it ran, by hand or a clean-up "
                                   "of /tmp)"
                                 : fmt::format("was {} while it ran", lost);
    return Status::Unavailable(fmt::format(
        "the cache server on port {} (process id {}) runs with run dir {}, but its "
        "socket {} {}: restart it with 'shmcache --stop{}' and 'shmcache --start{}'",
        port, pid_text, here.run_dir, here.socket_path, what, p, p));
  }
  // The admin names its own command; a trainer is told to run with that run
  // dir (its own command line is not known here).
  // Quoted as a shell reads it: a run dir with a space pastes as one word.
  const std::string there = ShellQuote(holder.run_dir);
  const std::string reach =
      command.empty()
          ? fmt::format("use it by running this process with SHMCACHE_RUN_DIR={}", there)
          : fmt::format("ask it with 'SHMCACHE_RUN_DIR={} shmcache {}{}'", there, command,
                        p);
  return Status::Unavailable(fmt::format(
      "no cache server is running on port {} with run dir {}; a server of yours on "
      "port {} runs with run dir {} (process id {}), and a user has one server per "
      "port: {}, or stop it with 'SHMCACHE_RUN_DIR={} shmcache --stop{}' before "
      "starting one here",
      port, here.run_dir, port, holder.run_dir, pid_text, reach, there, p));
}

}  // namespace shmcache
