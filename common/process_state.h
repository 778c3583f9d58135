// Whether a process is gone, for code that must not act while it can still
// run: recycling a client's memory, reusing an instance after its daemon.
#pragma once

#include <chrono>

namespace shmcache {

// True when no thread of `pid` can run any more: the process does not
// exist, or it is a zombie whose last thread has exited. (A killed
// process's leader turns zombie before its other threads are gone, and
// with them its open files and locks.) A pid of 0 or less counts as gone.
// By number only: once the process is gone, a new one given the same pid
// is taken for it. ProcessHandle does not have that flaw.
bool ProcessGone(int pid);

// True while `pid` is ending: its leader is a zombie, but other threads of
// it may still be exiting (and hold its open files and locks until the
// last is gone); false once it is gone, and for a live process. A leader
// that ended by itself (pthread_exit) while the others run on looks the
// same: callers wait on it for a bounded time only.
bool ProcessEnding(int pid);

// True while `pid`'s leader is stopped (SIGSTOP, Ctrl-Z, a debugger): it
// runs again only once sent SIGCONT. By number only, for messages.
bool ProcessStopped(int pid);

// ProcessHandle: one process, held by a pidfd (pidfd_open, Linux 5.3), so
// that waiting for it or signalling it never reaches another process that
// was given the same pid after it exited. Where pidfd_open is not there
// (older kernels, a seccomp filter that refuses it) it falls back to the
// pid, and to ProcessGone. Open it while the process is known to run.
//
// Not thread-safe; movable, not copyable.
class ProcessHandle {
 public:
  explicit ProcessHandle(int pid);
  ~ProcessHandle();
  ProcessHandle(ProcessHandle&& other) noexcept;
  ProcessHandle& operator=(ProcessHandle&& other) noexcept;
  ProcessHandle(const ProcessHandle&) = delete;
  ProcessHandle& operator=(const ProcessHandle&) = delete;

  int pid() const { return pid_; }
  // Whether the process is held by a pidfd (else by its number).
  bool has_pidfd() const { return pidfd_ >= 0; }

  // As ProcessGone: no thread of the process can run any more.
  bool Gone() const;
  // Sends `sig` to the process: 0, or the errno (ESRCH once it is gone).
  int Signal(int sig) const;
  // Waits until Gone(), at most `bound`; true when it is.
  bool WaitGone(std::chrono::milliseconds bound) const;

 private:
  int pid_ = 0;
  int pidfd_ = -1;
};

}  // namespace shmcache
