// A process's identity (common/process_identity.h): its start as the
// kernel gives it, the text a lock file records it in, and the check that
// tells a pid's writer from a later process given the pid.
#include "common/process_identity.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/child_process.h"

namespace shmcache {
namespace {

std::string BootIdRead() {
  std::string id;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), id);
  return id;
}

// A sleeper's identity as a lock file written by it records it.
ProcessIdentity Recorded(pid_t pid) {
  return ProcessIdentity{pid, ProcessStartTicks(pid), BootIdRead()};
}

TEST(ProcessIdentityTest, ThisProcessIsNamedByItsStartAndBoot) {
  const ProcessIdentity self = SelfIdentity();
  EXPECT_EQ(self.pid, getpid());
  EXPECT_GT(self.start_ticks, 0u);
  EXPECT_EQ(self.start_ticks, ProcessStartTicks(getpid()));
  EXPECT_EQ(self.boot_id, BootIdRead());
  EXPECT_EQ(ProcessStartTicks(0), 0u);
}

// The name in /proc/PID/stat is the process's to choose: one that looks
// like the fields after it does not move them.
TEST(ProcessIdentityTest, AProcessNameOfParenthesesAndNumbersMovesNoField) {
  const pid_t child = test::ForkChild([] {
    const uint64_t before = ProcessStartTicks(getpid());
    prctl(PR_SET_NAME, "x) 1 2 3 (4) 5");
    return before != 0 && ProcessStartTicks(getpid()) == before ? 0 : 1;
  });
  EXPECT_EQ(test::WaitChild(child), 0);
}

TEST(ProcessIdentityTest, TheTextReadsBackAndAnOlderVersionsHasNoStart) {
  const ProcessIdentity self = SelfIdentity();
  const ProcessIdentity read = ParseIdentity(IdentityText(self));
  EXPECT_EQ(read.pid, self.pid);
  EXPECT_EQ(read.start_ticks, self.start_ticks);
  EXPECT_EQ(read.boot_id, self.boot_id);
  for (const char* older : {"4242", "4242 ", "4242 123", "4242 123 not/a/boot",
                            "4242 -1 0d5c", "4242 x 0d5c"}) {
    const ProcessIdentity p = ParseIdentity(older);
    EXPECT_EQ(p.pid, 4242) << older;
    EXPECT_FALSE(p.has_start()) << older;
    EXPECT_EQ(p.boot_id, "") << older;
  }
  for (const char* none : {"", "x", "-5 1 0d5c", "0 1 0d5c", "99999999999"}) {
    EXPECT_EQ(ParseIdentity(none).pid, 0) << none;
  }
  EXPECT_EQ(IdentityText(ProcessIdentity{17, 0, ""}), "17");
}

TEST(ProcessIdentityTest, TheWriterItselfIsTheOwner) {
  const pid_t child = test::Sleeper();
  const ProcessIdentity recorded = Recorded(child);
  const ProcessHandle held(child);
  const OwnerCheck check = CheckOwner(held, recorded);
  EXPECT_EQ(check.verdict, Ownership::kOwner);
  test::KillAndReap(child);
}

// The pid's process started at another time than the file's writer: the
// pid was given again. The check names the start it found, and nothing is
// sent: the process lives on.
TEST(ProcessIdentityTest, AProcessThatStartedAtAnotherTimeIsNotTheWriter) {
  const pid_t child = test::Sleeper();
  ProcessIdentity recorded = Recorded(child);
  const uint64_t start = recorded.start_ticks;
  recorded.start_ticks = start - 1;
  const ProcessHandle held(child);
  const OwnerCheck check = CheckOwner(held, recorded);
  EXPECT_EQ(check.verdict, Ownership::kReplaced);
  EXPECT_EQ(check.found_ticks, start);
  EXPECT_FALSE(test::ProcessExited(child));
  test::KillAndReap(child);
}

TEST(ProcessIdentityTest, AWriterOfAnotherBootIsNotTheProcessWithItsPidNow) {
  const pid_t child = test::Sleeper();
  ProcessIdentity recorded = Recorded(child);
  recorded.boot_id = "00000000-0000-0000-0000-000000000000";
  EXPECT_EQ(CheckOwner(ProcessHandle(child), recorded).verdict, Ownership::kOtherBoot);
  test::KillAndReap(child);
}

// Held while it ran, then killed: gone whether reaped or not (a zombie
// runs no more), and so is a pid of none.
TEST(ProcessIdentityTest, AnEndedWriterIsGone) {
  const pid_t child = test::Sleeper();
  const ProcessIdentity recorded = Recorded(child);
  const ProcessHandle held(child);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  EXPECT_TRUE(held.WaitGone(std::chrono::seconds(20)));
  EXPECT_EQ(CheckOwner(held, recorded).verdict, Ownership::kGone) << "a zombie";
  test::KillAndReap(child);
  EXPECT_EQ(CheckOwner(held, recorded).verdict, Ownership::kGone) << "reaped";
  EXPECT_EQ(CheckOwner(ProcessHandle(0), ProcessIdentity{}).verdict, Ownership::kGone);
}

// An older version's record (the pid alone) of a running process: not
// known either way; what is done with it is the caller's choice.
TEST(ProcessIdentityTest, ARecordWithoutAStartIsUnknownWhileThePidRuns) {
  const pid_t child = test::Sleeper();
  const ProcessIdentity recorded{child, 0, ""};
  EXPECT_EQ(CheckOwner(ProcessHandle(child), recorded).verdict, Ownership::kUnrecorded);
  EXPECT_EQ(PidStillNamed(recorded), child);
  test::KillAndReap(child);
  EXPECT_EQ(PidStillNamed(recorded), 0);
}

}  // namespace
}  // namespace shmcache
