#include "tests/support/child_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "common/process_state.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {

pid_t ForkChild(const std::function<int()>& body) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 99;
    try {
      rc = body();
    } catch (...) {
      rc = 98;
    }
    fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

int RunInPidNamespace(const std::function<int()>& body) {
  pid_t outer = ForkChild([&body] {
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) return kNoPidNamespace;
    pid_t init = ForkChild([&body] {
      // Its own /proc, so that what reads /proc/<pid> sees this namespace.
      if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          mount("proc", "/proc", "proc", 0, nullptr) != 0) {
        return kNoPidNamespace;
      }
      return body();
    });
    int st = 0;
    if (init < 0 || waitpid(init, &st, 0) != init || !WIFEXITED(st)) {
      return kNoPidNamespace;
    }
    return WEXITSTATUS(st);
  });
  return WaitChild(outer);
}

bool EndsWithParent(pid_t parent) {
  return prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == parent;
}

pid_t Sleeper() {
  const pid_t parent = getpid();
  return ForkChild([parent] {
    if (!EndsWithParent(parent)) return 1;
    pause();
    return 0;
  });
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

pid_t SleeperWithPid(pid_t pid) {
  int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    std::string last = std::to_string(pid - 1);
    if (write(fd, last.data(), last.size()) < 0) {
      // The child gets another pid; the caller sees it.
    }
    close(fd);
  }
  return Sleeper();
}

namespace {

enum class Wait { kEnded, kRunning, kNotAChild };

// Waits at most `bound` for `pid`; *st: its wait status once it ended.
Wait AwaitExit(pid_t pid, int* st, std::chrono::milliseconds bound) {
  bool not_a_child = false;
  bool ended = WaitFor(
      [&] {
        pid_t r = waitpid(pid, st, WNOHANG);
        not_a_child = r < 0 && errno == ECHILD;
        return r == pid || not_a_child;
      },
      bound);
  if (not_a_child) return Wait::kNotAChild;
  return ended ? Wait::kEnded : Wait::kRunning;
}

}  // namespace

bool WaitChild(pid_t pid, int* wstatus, std::chrono::milliseconds bound) {
  int st = 0;
  if (AwaitExit(pid, &st, bound) != Wait::kEnded) return false;
  if (wstatus) *wstatus = st;
  return true;
}

int WaitChild(pid_t pid, int timeout_s) {
  if (pid <= 0) return -1;
  int st = 0;
  switch (AwaitExit(pid, &st, std::chrono::seconds(timeout_s))) {
    case Wait::kNotAChild: return -1;
    case Wait::kRunning:
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -9;
    case Wait::kEnded: break;
  }
  return ExitCode(st);
}

int ExitCode(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return -WTERMSIG(st);
  return -1;
}

std::string DescribeStatus(int st) {
  if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    return "signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) +
           ")";
  }
  return "status " + std::to_string(st);
}

bool ProcessExited(pid_t pid) { return ProcessGone(pid); }

bool StopProcess(pid_t pid) {
  if (kill(pid, SIGSTOP) != 0) return false;
  auto all_stopped = [pid] {
    std::string dir = fmt::format("/proc/{}/task", pid);
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return false;
    bool stopped = true;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::string stat;
      std::getline(std::ifstream(dir + "/" + e->d_name + "/stat"), stat);
      size_t paren = stat.rfind(')');
      if (paren == std::string::npos || paren + 2 >= stat.size() ||
          stat[paren + 2] != 'T') {
        stopped = false;
      }
    }
    closedir(d);
    return stopped;
  };
  return WaitFor(all_stopped, std::chrono::seconds(20));
}

ContinuedAfter::ContinuedAfter(pid_t pid) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) std::abort();
  guard_ = fork();
  if (guard_ < 0) std::abort();
  if (guard_ == 0) {
    // Only the read end: a copy of the test's sockets or of meson's output
    // pipe would change what the test, or meson, sees.
    setsid();
    dup2(fds[0], 0);
    close_range(1, ~0U, 0);
    char c;
    ssize_t n;
    do {
      n = read(0, &c, 1);
    } while (n > 0 || (n < 0 && errno == EINTR));
    kill(pid, SIGCONT);
    _exit(0);
  }
  close(fds[0]);
  pipe_ = fds[1];
}

ContinuedAfter::~ContinuedAfter() {
  close(pipe_);
  WaitChild(guard_, 20);
}

void* MapShared(size_t bytes) {
  void* p =
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  return p;
}

}  // namespace shmcache::test
