// Forked children of a test, their exit, and memory shared with them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <new>
#include <string>

namespace shmcache::test {

// Forks; the child runs `body` and _exits with its result (98 if it threw),
// never returning into the test framework (gtest is not used in children).
// Returns the child's pid (-1 when fork failed).
pid_t ForkChild(const std::function<int()>& body);

// Waits at most `bound` for child `pid` to end and stores its raw wait
// status in *wstatus. False if it did not end (it is left running) or is
// not a child of this process.
bool WaitChild(pid_t pid, int* wstatus, std::chrono::milliseconds bound);
// Waits at most timeout_s for child `pid`; returns its exit code, -signal
// when a signal ended it, or -9 after killing it on timeout (-1: no such
// child).
int WaitChild(pid_t pid, int timeout_s = 60);
// The exit code of a wait status, or -signal when a signal ended it.
int ExitCode(int wstatus);
// Describes a wait status: "exit 0", "signal 9 (Killed)".
std::string DescribeStatus(int wstatus);

// True once pid is gone or a zombie (it exited; the reaper may be slow).
bool ProcessExited(pid_t pid);

// SIGSTOPs `pid` and waits (at most 20 s) until every thread of it is
// stopped: kill() returns before a thread running on another CPU has
// stopped, and such a thread could still answer a request sent meanwhile.
// False when it could not be stopped.
bool StopProcess(pid_t pid);

// Whatever stops process `pid` (StopProcess) while a ContinuedAfter lives
// runs again (SIGCONT) when it ends, or when this process dies first (a
// crash, a kill on timeout): a stopped daemon cannot see that the test it
// watches is gone, and would outlive it. A guard process in a session of
// its own (a group kill spares it) waits for the end of a pipe this
// process holds; children forked meanwhile hold it too, until they end.
class ContinuedAfter {
 public:
  explicit ContinuedAfter(pid_t pid);
  ~ContinuedAfter();  // the SIGCONT sent, the guard reaped
  ContinuedAfter(const ContinuedAfter&) = delete;
  ContinuedAfter& operator=(const ContinuedAfter&) = delete;

 private:
  int pipe_ = -1;
  pid_t guard_ = -1;
};

// In a child of process `parent` (its pid, read before the fork): the
// kernel SIGKILLs this process when the thread that forked it ends
// (PR_SET_PDEATHSIG), so that a child that waits to be killed does not
// outlive a test killed first (a timeout, a crash). False when that could
// not be set, or `parent` is gone already: the child should exit then.
bool EndsWithParent(pid_t parent);

// Forks a child that waits until it is killed (KillAndReap), or until the
// thread that forked it ends (EndsWithParent).
pid_t Sleeper();
// SIGKILLs child `pid` and reaps it: its pid is free to be given again.
void KillAndReap(pid_t pid);

// Runs `body` in a child that is pid 1 of a new pid namespace with its own
// /proc (so that the namespace can give a pid again: SleeperWithPid).
// Returns body's result as WaitChild does, or kNoPidNamespace when the
// namespaces cannot be made (not root, or a container that forbids them).
inline constexpr int kNoPidNamespace = 111;
int RunInPidNamespace(const std::function<int()>& body);
// In RunInPidNamespace's body: forks a child that waits until killed,
// asking the namespace to give it `pid` (a pid that ended and was reaped).
// Returns the child's pid, which is not `pid` when the kernel would not.
pid_t SleeperWithPid(pid_t pid);

// Anonymous memory shared with children forked after it, zeroed. Never
// freed (a few pages per test). Aborts when it cannot be mapped.
void* MapShared(size_t bytes);
// A T value-initialised in such memory.
template <typename T>
T* SharedBlock() {
  void* p = MapShared(sizeof(T));
  return new (p) T();
}

}  // namespace shmcache::test
