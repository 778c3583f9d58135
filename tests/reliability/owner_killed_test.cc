// A server a test starts ends with the test's process: a test that
// crashes, or that meson kills on timeout, leaves no shmcached behind (a
// TestDaemon's would keep meson's output pipe open, and the run would
// never end). Also when the test dies while its server is stopped
// (SIGSTOP, as the suites that simulate a hung server do). And not
// earlier: a TestDaemon started from a thread outlives the thread.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/process_state.h"
#include "tests/support/test_daemon.h"
#include "tests/support/test_server.h"

namespace shmcache::test {
namespace {

// What the owner (a forked child) tells the test about its server.
struct Owned {
  std::atomic<int> state{0};  // 1: its server serves; -1: it could not start one
  pid_t server = 0;
  uid_t uid = 0;  // the server's
  int port = 0;
  char shm_dir[256] = {};
  char tmp_dir[256] = {};  // its run and log dirs are in it
};

// Its port, paths and files, as TestDaemon and TestServer have them.
template <typename Server>
void Tell(const Server& s, pid_t pid, const std::string& tmp_dir, Owned* o) {
  o->server = pid;
  o->uid = geteuid();
  o->port = s.port();
  std::snprintf(o->shm_dir, sizeof o->shm_dir, "%s", s.shm_dir().c_str());
  std::snprintf(o->tmp_dir, sizeof o->tmp_dir, "%s", tmp_dir.c_str());
}

// The server: a TestDaemon (a child of the test), one run as another user
// (a death signal is cleared by setuid), a TestServer (started by the
// admin, as users do), or one the test starts with the admin on a
// TestDaemon's instance (AdminEnv), as stale_state_test does; running, or
// stopped when its owner is killed.
enum class Kind { kTestDaemon, kTestDaemonAsNobody, kTestServer, kAdminStart };
constexpr uid_t kNobody = 65534;
struct Case {
  Kind kind;
  bool stopped;
};

std::string Name(const Case& c) {
  static const char* const kNames[] = {"TestDaemon", "TestDaemonAsNobody", "TestServer",
                                       "AdminStart"};
  return std::string(kNames[static_cast<int>(c.kind)]) +
         (c.stopped ? "Stopped" : "Running");
}

void PrintTo(const Case& c, std::ostream* os) { *os << Name(c); }

// What the owner holds until it is killed: its server, and, for one
// started by the admin that it stopped, what a test that stops one holds.
struct Owner {
  std::optional<TestDaemon> d;
  std::optional<TestServer> s;
  std::optional<ContinuedAfter> continued;

  // Starts the server (and stops it, if asked) and tells the test.
  bool Start(const Case& c, Owned* o) {
    if (c.kind == Kind::kTestServer) {
      s.emplace();
      if (!s->ok()) return false;
      Tell(*s, s->pid(), s->run_dir(), o);
    } else {
      d.emplace();
      TestDaemon::Options opts;
      if (c.kind == Kind::kTestDaemonAsNobody) {
        opts.uid = kNobody;
        opts.shm_dir =
            MakeTempDir("/dev/shm", TaggedPrefix("shmcache-rel"));  // one it may write
        if (opts.shm_dir.empty() || chmod(opts.shm_dir.c_str(), 01777) != 0) return false;
      }
      if (!d->Start(opts).ok()) return false;
      const std::string& run = d->run_dir();
      Tell(*d, d->pid(), run.substr(0, run.rfind('/')), o);
      if (opts.uid != 0) o->uid = opts.uid;
    }
    if (c.kind == Kind::kAdminStart && !AdminStart(o)) return false;
    if (c.kind == Kind::kTestServer || c.kind == Kind::kAdminStart) {
      if (c.stopped) continued.emplace(o->server);
    }
    return !c.stopped || StopProcess(o->server);
  }

  // The TestDaemon killed, and a server started on its instance by the
  // admin in its place.
  bool AdminStart(Owned* o) {
    d->Kill();
    std::string out;
    if (RunProgram({AdminPath(), "--start", "-p", std::to_string(d->port()), "--shm_dir",
                    d->shm_dir(), "--log_dir", d->log_dir(), "-w", "1"},
                   d->AdminEnv(), &out) != 0) {
      return false;
    }
    std::unique_ptr<Client> c;
    ServerInfo info;
    if (!Client::Connect(d->client_options(), &c).ok() || !c->GetServerInfo(&info).ok()) {
      return false;
    }
    o->server = static_cast<pid_t>(info.pid);
    return true;
  }
};

class OwnerKilled : public ::testing::TestWithParam<Case> {
 protected:
  // Forks the owner, which starts a server (and stops it, if asked) and
  // waits to be killed.
  void StartOwner() {
    owned_ = SharedBlock<Owned>();
    Owned* o = owned_;
    const Case c = GetParam();
    const pid_t test = getpid();
    owner_ = ForkChild([o, c, test]() -> int {
      // An owner outliving a killed test would keep its server for good.
      if (!EndsWithParent(test)) return 1;
      Owner owner;
      o->state = owner.Start(c, o) ? 1 : -1;
      for (;;) pause();
    });
    ASSERT_GT(owner_, 0);
    ASSERT_TRUE(WaitFor([o] { return o->state != 0; }, std::chrono::seconds(60)));
    ASSERT_EQ(o->state, 1) << "the owner could not start (or stop) its server";
    // Held while the server surely runs: the cleanup never signals
    // another process given its pid.
    server_ = std::make_unique<ProcessHandle>(o->server);
  }

  // Whether the owner's server ended within a bound long enough for any
  // loaded host (its watch looks every 200 ms).
  bool ServerEnds() const { return server_->WaitGone(std::chrono::seconds(30)); }

  std::vector<std::string> ServerFiles() const {
    return InstanceFiles(owned_->shm_dir, InstancePrefix(owned_->uid, owned_->port));
  }

  // Whatever the outcome: the owner and its server killed, and what the
  // owner could not remove (it was killed) removed.
  void TearDown() override {
    if (owner_ > 0) KillAndReap(owner_);
    if (server_ != nullptr && !server_->Gone()) {
      server_->Signal(SIGKILL);
      server_->WaitGone(std::chrono::seconds(20));
    }
    if (owned_ == nullptr || owned_->state != 1) return;
    const std::string shm_dir = owned_->shm_dir;
    RemoveKilledInstance(
        fmt::format("/dev/shm/.shmcache.{}.{}.lock", owned_->uid, owned_->port), [&] {
          for (const std::string& f : ServerFiles()) {
            unlink(fmt::format("{}/{}", shm_dir, f).c_str());
          }
        });
    RemoveTree(shm_dir);
    RemoveTree(owned_->tmp_dir);
  }

  Owned* owned_ = nullptr;
  pid_t owner_ = -1;
  std::unique_ptr<ProcessHandle> server_;
};

TEST_P(OwnerKilled, TheServerEndsAndRemovesItsSegments) {
  if (GetParam().kind == Kind::kTestDaemonAsNobody) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run a server as another uid";
    if (!RunnableBy(kNobody, DaemonPath())) {
      GTEST_SKIP() << DaemonPath() << " is out of reach of uid " << kNobody
                   << " (a parent directory is closed to other users)";
    }
  }
  ASSERT_NO_FATAL_FAILURE(StartOwner());
  KillAndReap(owner_);
  owner_ = -1;
  EXPECT_TRUE(ServerEnds()) << "server " << owned_->server << " outlived its owner";
  // It stopped as a stopped server does, not killed: nothing of it is left.
  EXPECT_EQ(ServerFiles(), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(
    Each, OwnerKilled,
    ::testing::Values(Case{Kind::kTestDaemon, false}, Case{Kind::kTestDaemon, true},
                      Case{Kind::kTestDaemonAsNobody, false},
                      Case{Kind::kTestDaemonAsNobody, true},
                      Case{Kind::kTestServer, false}, Case{Kind::kTestServer, true},
                      Case{Kind::kAdminStart, false}, Case{Kind::kAdminStart, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return Name(i.param); });

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
