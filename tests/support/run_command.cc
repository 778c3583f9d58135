#include "tests/support/run_command.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tests/support/child_process.h"

extern char** environ;

namespace shmcache::test {

namespace {

using Clock = std::chrono::steady_clock;

// The current environment with `env` laid over it, as NAME=value strings.
std::vector<std::string> MergedEnvironment(const Env& env) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string s = *e;
    std::string name = s.substr(0, s.find('='));
    bool overridden = std::any_of(env.begin(), env.end(),
                                  [&](const auto& kv) { return kv.first == name; });
    if (!overridden) out.push_back(s);
  }
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

// In the forked child: only async-signal-safe calls.
[[noreturn]] void ExecChild(int out_fd, int err_fd, int uid, char** argv, char** envp) {
  dup2(out_fd, 1);
  dup2(err_fd, 2);
  if (uid >= 0) {
    if (setresgid(static_cast<gid_t>(uid), static_cast<gid_t>(uid),
                  static_cast<gid_t>(uid)) != 0 ||
        setgroups(0, nullptr) != 0 ||
        setresuid(static_cast<uid_t>(uid), static_cast<uid_t>(uid),
                  static_cast<uid_t>(uid)) != 0) {
      _exit(126);
    }
  }
  execve(argv[0], argv, envp);
  _exit(127);
}

// Reads fds[0..1] into sinks until both are closed or `deadline` passes;
// false on the deadline. Closes the fds.
bool ReadUntilClosed(int fds_in[2], std::string* sinks[2], Clock::time_point deadline) {
  pollfd fds[2] = {{fds_in[0], POLLIN, 0}, {fds_in[1], POLLIN, 0}};
  int open_fds = 2;
  bool in_time = true;
  char buf[4096];
  while (open_fds > 0) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      in_time = false;
      break;
    }
    int n = poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  return in_time;
}

}  // namespace

std::string CommandResult::Describe() const {
  return "exit " + std::to_string(exit_code) + "\n--- stdout\n" + out + "--- stderr\n" +
         err;
}

CommandResult RunCommand(const std::vector<std::string>& argv, const RunOptions& o) {
  CommandResult r;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    r.err = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    r.err = std::string("pipe: ") + std::strerror(errno);
    close(out_pipe[0]);
    close(out_pipe[1]);
    return r;
  }
  // Build argv/envp before fork: the child only calls async-signal-safe
  // functions.
  std::vector<std::string> env_strings = MergedEnvironment(o.env);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv, cenv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (std::string& e : env_strings) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  auto deadline = Clock::now() + o.timeout;
  pid_t pid = fork();
  if (pid < 0) {
    r.err = std::string("fork: ") + std::strerror(errno);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return r;
  }
  if (pid == 0) {
    ExecChild(out_pipe[1], o.merge_stderr ? out_pipe[1] : err_pipe[1], o.uid,
              cargv.data(), cenv.data());
  }
  r.ran = true;
  close(out_pipe[1]);
  close(err_pipe[1]);
  int read_fds[2] = {out_pipe[0], err_pipe[0]};
  std::string* sinks[2] = {&r.out, &r.err};
  bool in_time = ReadUntilClosed(read_fds, sinks, deadline);
  // Output closed: the child is ending; wait for it within what is left.
  auto left = std::max<Clock::duration>(deadline - Clock::now(), std::chrono::seconds(1));
  int st = 0;
  if (!in_time ||
      !WaitChild(pid, &st, std::chrono::duration_cast<std::chrono::milliseconds>(left))) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    r.exit_code = -9;
    r.timed_out = true;
    r.err +=
        "\n[test: command timed out after " + std::to_string(o.timeout.count()) + " ms]";
    return r;
  }
  r.exit_code = ExitCode(st);
  return r;
}

CommandResult RunCommand(const std::vector<std::string>& argv, const Env& env,
                         int timeout_s, int uid) {
  return RunCommand(
      argv,
      RunOptions{.env = env, .timeout = std::chrono::seconds(timeout_s), .uid = uid});
}

int RunProgram(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               std::string* output, std::chrono::milliseconds bound) {
  RunOptions o{.timeout = bound, .merge_stderr = true};
  for (const std::string& e : env) {
    size_t eq = e.find('=');
    o.env.emplace_back(e.substr(0, eq), eq == std::string::npos ? "" : e.substr(eq + 1));
  }
  CommandResult r = RunCommand(argv, o);
  if (output) *output = r.out;
  if (!r.ran || r.timed_out) return -1;
  return r.exit_code < 0 ? 128 - r.exit_code : r.exit_code;
}

}  // namespace shmcache::test
