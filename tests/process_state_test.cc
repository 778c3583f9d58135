// Process liveness (common/process_state.h): ProcessGone by number, and
// ProcessHandle, which holds the process itself and so is never fooled by
// a new process given the same pid.
#include "common/process_state.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/test_server.h"

namespace shmcache {
namespace {

using namespace std::chrono_literals;
using test::ForkChild;
using test::WaitChild;

using test::Sleeper;

TEST(ProcessStateTest, AZombieIsGoneAndSoIsAReapedProcess) {
  pid_t pid = Sleeper();
  EXPECT_FALSE(ProcessGone(pid));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_TRUE(test::WaitFor([&] { return ProcessGone(pid); })) << "a zombie: gone";
  EXPECT_EQ(WaitChild(pid), -SIGKILL);
  EXPECT_TRUE(ProcessGone(pid));
  EXPECT_TRUE(ProcessGone(0));
}

// A stopped process (SIGSTOP) is named as such until SIGCONT; a gone one,
// or no pid, never is.
TEST(ProcessStateTest, AStoppedProcessIsStoppedUntilContinued) {
  pid_t pid = Sleeper();
  EXPECT_FALSE(ProcessStopped(pid));
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  EXPECT_TRUE(test::WaitFor([&] { return ProcessStopped(pid); }));
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  EXPECT_TRUE(test::WaitFor([&] { return !ProcessStopped(pid); }));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(WaitChild(pid), -SIGKILL);
  EXPECT_FALSE(ProcessStopped(pid));
  EXPECT_FALSE(ProcessStopped(0));
}

TEST(ProcessHandleTest, WaitsForTheProcessToEnd) {
  pid_t pid = Sleeper();
  ProcessHandle h(pid);
  EXPECT_EQ(h.pid(), pid);
  EXPECT_FALSE(h.Gone());
  EXPECT_FALSE(h.WaitGone(20ms)) << "it runs on";
  EXPECT_EQ(h.Signal(SIGTERM), 0);
  EXPECT_TRUE(h.WaitGone(20s));
  EXPECT_TRUE(h.Gone()) << "a zombie not yet reaped is gone";
  EXPECT_EQ(WaitChild(pid), -SIGTERM);
  EXPECT_TRUE(h.Gone());
  EXPECT_EQ(h.Signal(SIGTERM), ESRCH);
}

TEST(ProcessHandleTest, MovesItsHold) {
  pid_t pid = Sleeper();
  ProcessHandle a(pid);
  bool pidfd = a.has_pidfd();
  ProcessHandle b(std::move(a));
  EXPECT_EQ(b.has_pidfd(), pidfd);
  EXPECT_FALSE(b.Gone());
  EXPECT_EQ(b.Signal(SIGKILL), 0);
  EXPECT_EQ(WaitChild(pid), -SIGKILL);
  EXPECT_TRUE(b.Gone());
}

// Exit codes of the namespace child below.
constexpr int kReused = 0, kNotGone = 1, kSignalledTheNewOne = 2, kNewOneHurt = 3,
              kPidCheckNotFooled = 4, kNoPidfd = 10, kPidNotReused = 12;

// Runs as pid 1 of a fresh pid namespace, with its own /proc: process A
// gets pid 2 and a handle; A ends; B is given pid 2. The handle must know
// A is gone and must not signal B, where a check by number takes B for A.
int HandleAcrossPidReuse() {
  pid_t a = Sleeper();
  ProcessHandle handle(a);
  if (!handle.has_pidfd()) return kNoPidfd;
  kill(a, SIGKILL);
  waitpid(a, nullptr, 0);
  pid_t b = test::SleeperWithPid(a);
  int rc = kReused;
  if (b != a) {
    rc = kPidNotReused;
  } else if (ProcessGone(a)) {
    rc = kPidCheckNotFooled;  // then this test would prove nothing
  } else if (!handle.Gone() || !handle.WaitGone(std::chrono::milliseconds(0))) {
    rc = kNotGone;
  } else if (handle.Signal(SIGTERM) != ESRCH) {
    rc = kSignalledTheNewOne;
  } else if (waitpid(b, nullptr, WNOHANG) != 0) {
    rc = kNewOneHurt;
  }
  kill(b, SIGKILL);
  waitpid(b, nullptr, 0);
  return rc;
}

TEST(ProcessHandleTest, NeverTakesANewProcessWithTheSamePidForTheOldOne) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: a pid namespace to give a pid twice";
  int rc = test::RunInPidNamespace(HandleAcrossPidReuse);
  if (rc == test::kNoPidNamespace) {
    GTEST_SKIP() << "cannot make a pid and mount namespace here";
  }
  if (rc == kNoPidfd) GTEST_SKIP() << "no pidfd_open on this kernel (Linux < 5.3)";
  EXPECT_NE(rc, kPidNotReused) << "could not give the pid again";
  EXPECT_NE(rc, kPidCheckNotFooled) << "ProcessGone saw through the reuse";
  EXPECT_EQ(rc, kReused);
}

}  // namespace
}  // namespace shmcache
