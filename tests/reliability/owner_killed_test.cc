// A TestDaemon ends with the process that started it: a test that crashes,
// or that meson kills on timeout, leaves no shmcached behind (one would
// keep meson's output pipe open, and the run would never end). Also when
// the test dies while its daemon is stopped (SIGSTOP, as the suites that
// simulate a hung daemon do). And not earlier: a daemon started from a
// thread outlives the thread.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/process_state.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

// What the owner (a forked child) tells the test about its daemon.
struct Owned {
  std::atomic<int> state{0};  // 1: its daemon serves; -1: it could not start one
  pid_t daemon = 0;
  int port = 0;
  char shm_dir[256] = {};
  char run_dir[256] = {};
};

class OwnerKilled : public ::testing::Test {
 protected:
  // Forks the owner, which starts a TestDaemon and waits to be killed.
  void StartOwner() {
    owned_ = SharedBlock<Owned>();
    Owned* o = owned_;
    owner_ = ForkChild([o] {
      TestDaemon d;
      if (!d.Start().ok()) {
        o->state = -1;
        return 1;
      }
      o->daemon = d.pid();
      o->port = d.port();
      std::snprintf(o->shm_dir, sizeof o->shm_dir, "%s", d.shm_dir().c_str());
      std::snprintf(o->run_dir, sizeof o->run_dir, "%s", d.run_dir().c_str());
      o->state = 1;
      for (;;) pause();
    });
    ASSERT_GT(owner_, 0);
    ASSERT_TRUE(WaitFor([o] { return o->state != 0; }, std::chrono::seconds(60)));
    ASSERT_EQ(o->state, 1) << "the owner could not start its daemon";
    // Held while the daemon surely runs: the cleanup never signals
    // another process given its pid.
    daemon_ = std::make_unique<ProcessHandle>(o->daemon);
  }

  // Whether the owner's daemon ended within a bound long enough for any
  // loaded host (its watch looks every 200 ms).
  bool DaemonEnds() const { return daemon_->WaitGone(std::chrono::seconds(30)); }

  // Whatever the outcome: the owner and its daemon killed, and what the
  // owner's TestDaemon could not remove (it was killed) removed.
  void TearDown() override {
    if (owner_ > 0) KillAndReap(owner_);
    if (daemon_ != nullptr && !daemon_->Gone()) {
      daemon_->Signal(SIGKILL);
      daemon_->WaitGone(std::chrono::seconds(20));
    }
    if (owned_ == nullptr || owned_->state != 1) return;
    const std::string shm_dir = owned_->shm_dir;
    for (const std::string& f :
         InstanceFiles(shm_dir, InstancePrefix(geteuid(), owned_->port))) {
      unlink(fmt::format("{}/{}", shm_dir, f).c_str());
    }
    RemoveUnheldLock(
        fmt::format("/dev/shm/.shmcache.{}.{}.lock", geteuid(), owned_->port));
    RemoveTree(shm_dir);
    const std::string run_dir = owned_->run_dir;
    RemoveTree(run_dir.substr(0, run_dir.rfind('/')));  // the TestDaemon's base dir
  }

  Owned* owned_ = nullptr;
  pid_t owner_ = -1;
  std::unique_ptr<ProcessHandle> daemon_;
};

TEST_F(OwnerKilled, TheDaemonEndsAndRemovesItsSegments) {
  ASSERT_NO_FATAL_FAILURE(StartOwner());
  KillAndReap(owner_);
  owner_ = -1;
  EXPECT_TRUE(DaemonEnds()) << "daemon " << owned_->daemon << " outlived its owner";
  // It stopped as a stopped server does, not killed: nothing of it is left.
  EXPECT_EQ(InstanceFiles(owned_->shm_dir, InstancePrefix(geteuid(), owned_->port)),
            std::vector<std::string>{});
}

TEST_F(OwnerKilled, AStoppedDaemonEndsToo) {
  ASSERT_NO_FATAL_FAILURE(StartOwner());
  ASSERT_TRUE(StopProcess(owned_->daemon));
  KillAndReap(owner_);
  owner_ = -1;
  EXPECT_TRUE(DaemonEnds()) << "stopped daemon " << owned_->daemon
                            << " outlived its owner";
}

// The daemon's parent is the thread that forked it; that thread's end is
// not its owner's.
TEST(OwnerThreadEnds, TheDaemonServesOn) {
  TestDaemon d;
  Status started;
  pid_t tid = 0;
  std::thread([&] {
    tid = gettid();
    started = d.Start();
  }).join();
  ASSERT_TRUE(started.ok()) << started.ToString();
  // The thread's exit has told its children once its task is gone.
  ASSERT_TRUE(
      WaitFor([&] { return !PathExists(fmt::format("/proc/self/task/{}", tid)); }));
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Connect(d.client_options(), &c).ok());
  uint32_t sid = 0;
  EXPECT_TRUE(c->CreateSession(&sid).ok());
  EXPECT_TRUE(d.Alive());
}

}  // namespace
}  // namespace shmcache::test
