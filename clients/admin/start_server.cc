#include "clients/admin/start_server.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "common/option_checks.h"
#include "common/server_flags.h"

namespace shmcache::admin {

static bool Executable(const std::string& p) {
  return !p.empty() && access(p.c_str(), X_OK) == 0;
}

std::string FindDaemon() {
  if (const char* env = std::getenv("SHMCACHE_DAEMON"); env && Executable(env)) {
    return env;
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    for (const std::string& c : {dir + "/shmcached", dir + "/../../daemon/shmcached"}) {
      if (Executable(c)) return c;
    }
  }
  if (Executable(SHMCACHE_INSTALLED_DAEMON)) return SHMCACHE_INSTALLED_DAEMON;
  return "shmcached";  // execvp searches $PATH
}

Status StartServer(const CliArgs& a, int port, StartResult* out) {
  Status s = CheckServerFlags(a.server);
  if (!s.ok()) return s;
  // Test harnesses tie the server to their own process (docs/admin-cli.md).
  const char* env = std::getenv("SHMCACHE_WATCH_PID");
  const std::string watch = env != nullptr ? env : "";
  if (!watch.empty()) {
    long pid = 0;
    s = ParseInRange("SHMCACHE_WATCH_PID", watch, 1, 1L << 30, &pid);
    if (!s.ok()) {
      return Status::InvalidArgument(s.message() +
                                     "; unset it or set it to the pid of a live process");
    }
  }

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
  // --ready_fd first: the daemon reads its line in order, so an argument it
  // refuses is reported on the pipe, not to the /dev/null of its stderr.
  std::vector<std::string> args = {FindDaemon(), fmt::format("--ready_fd={}", fds[1]),
                                   fmt::format("--port={}", port)};
  args.insert(args.end(), a.server_args.begin(), a.server_args.end());
  if (!watch.empty()) args.push_back("--watch_pid=" + watch);
  pid_t pid = fork();
  if (pid < 0) return Status::FromErrno("fork", errno);
  if (pid == 0) {
    setsid();
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
      dup2(null, 2);
    }
    fcntl(fds[1], F_SETFD, 0);  // the daemon inherits the write end only
    std::vector<char*> cargs;
    cargs.reserve(args.size() + 1);
    for (std::string& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    execvp(cargs[0], cargs.data());
    std::string msg =
        fmt::format("ERR cannot run {}: {}\n", args[0], std::strerror(errno));
    ssize_t w = write(fds[1], msg.data(), msg.size());
    (void)w;
    _exit(127);
  }
  close(fds[1]);
  std::string line;
  char buf[512];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    int r = poll(&p, 1, 60000);
    if (r == 0) {
      close(fds[0]);
      return Status::Unavailable(
          "the cache server did not report readiness within 60 s; see its log");
    }
    if (r < 0 && errno == EINTR) continue;
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  std::istringstream report(line);
  while (std::getline(report, line) && line.rfind("NOTE ", 0) == 0) {
    out->notes.push_back(line.substr(5));
  }
  if (line.rfind("OK ", 0) == 0) {
    std::istringstream in(line.substr(3));
    in >> out->pid >> out->workers;
    in.get();  // the space before the log path, which may hold spaces
    std::getline(in, out->log_path);
    return Status::OK();
  }
  int st = 0;
  waitpid(pid, &st, 0);  // it failed: reap it
  if (line.rfind("ERR ", 0) == 0) {
    std::string why = line.substr(4);
    if (why.find("already running") != std::string::npos) {
      return Status::AlreadyExists(why);
    }
    return Status::IOError(why);
  }
  return Status::IOError("the cache server exited before reporting readiness");
}

}  // namespace shmcache::admin
