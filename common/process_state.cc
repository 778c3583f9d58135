#include "common/process_state.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "format/parse_number.h"

namespace shmcache {

namespace {

// The state letter of `pid`'s leader and the count of its threads, from
// /proc/<pid>/status; false when there is none to read (the process is gone).
bool ReadProcessState(int pid, char* state, long* threads) {
  FILE* f = fopen(fmt::format("/proc/{}/status", pid).c_str(), "r");
  if (f == nullptr) return false;
  char line[256];
  *state = 'R';
  *threads = 1;
  while (fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "State:", 6) == 0) {
      std::sscanf(line + 6, " %c", state);
    } else if (std::strncmp(line, "Threads:", 8) == 0) {
      LeadingLong(line + 8, threads);
    }
  }
  fclose(f);
  return true;
}

}  // namespace

bool ProcessGone(int pid) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char state = 'R';
  long threads = 1;
  if (!ReadProcessState(pid, &state, &threads)) return true;
  return (state == 'Z' || state == 'X') && threads <= 1;
}

bool ProcessEnding(int pid) {
  char state = 'R';
  long threads = 1;
  return pid > 0 && ReadProcessState(pid, &state, &threads) &&
         (state == 'Z' || state == 'X') && threads > 1;
}

bool ProcessStopped(int pid) {
  char state = 'R';
  long threads = 1;
  return pid > 0 && ReadProcessState(pid, &state, &threads) &&
         (state == 'T' || state == 't');
}

namespace {

int PidfdOpen(int pid) {
#ifdef SYS_pidfd_open
  if (pid > 0) return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#endif
  return -1;
}

int PidfdSendSignal(int pidfd, int sig) {
#ifdef SYS_pidfd_send_signal
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

// Readable once the process has exited and its last thread is gone.
bool PidfdReadable(int pidfd, int timeout_ms) {
  pollfd p{pidfd, POLLIN, 0};
  int r;
  while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  return r > 0;
}

}  // namespace

ProcessHandle::ProcessHandle(int pid) : pid_(pid), pidfd_(PidfdOpen(pid)) {}

ProcessHandle::~ProcessHandle() {
  if (pidfd_ >= 0) close(pidfd_);
}

ProcessHandle::ProcessHandle(ProcessHandle&& other) noexcept
    : pid_(other.pid_), pidfd_(std::exchange(other.pidfd_, -1)) {}

ProcessHandle& ProcessHandle::operator=(ProcessHandle&& other) noexcept {
  if (this != &other) {
    if (pidfd_ >= 0) close(pidfd_);
    pid_ = other.pid_;
    pidfd_ = std::exchange(other.pidfd_, -1);
  }
  return *this;
}

bool ProcessHandle::Gone() const {
  if (pidfd_ >= 0) return PidfdReadable(pidfd_, 0);
  return ProcessGone(pid_);
}

int ProcessHandle::Signal(int sig) const {
  if (pidfd_ >= 0 && PidfdSendSignal(pidfd_, sig) == 0) return 0;
  if (pidfd_ >= 0 && errno != ENOSYS) return errno;
  if (pid_ <= 0) return ESRCH;
  return kill(pid_, sig) == 0 ? 0 : errno;
}

bool ProcessHandle::WaitGone(std::chrono::milliseconds bound) const {
  if (pidfd_ >= 0) return PidfdReadable(pidfd_, static_cast<int>(bound.count()));
  auto deadline = std::chrono::steady_clock::now() + bound;
  while (!ProcessGone(pid_)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace shmcache
