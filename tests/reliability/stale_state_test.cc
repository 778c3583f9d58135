// Stale state: a killed daemon's socket, lock file and shared memory never
// block a new --start; a live instance is never clobbered by a second one;
// --stop ends a server that is still starting.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

std::vector<std::string> StartArgs(const TestDaemon& d) {
  return {AdminPath(), "--start",   "-p",        std::to_string(d.port()),
          "--shm_dir", d.shm_dir(), "--log_dir", d.log_dir(),
          "-w",        "1"};
}

bool Exists(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

TEST(StaleState, KilledDaemonLeavesNothingThatBlocksANewStart) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  SessionCache sc;
  ASSERT_TRUE(OpenSessionCache(d, "f", &sc).ok());
  std::unique_ptr<Client>& c = sc.client;
  std::unique_ptr<Cache>& cache = sc.cache;
  RowMaker m(1024);
  for (uint64_t id = 0; id < 100; ++id) ASSERT_TRUE(m.Put(*cache, id).ok());
  cache.reset();
  c.reset();
  d.Kill();

  const std::string sock = fmt::format("{}/shmcached-{}.sock", d.run_dir(), d.port());
  const std::string lock = fmt::format("{}/shmcached-{}.lock", d.run_dir(), d.port());
  ASSERT_TRUE(Exists(sock)) << "expected the killed daemon's socket to remain";
  ASSERT_TRUE(Exists(lock));
  ASSERT_FALSE(d.ShmFiles().empty());
  // A stale lock file naming a pid that is not ours either.
  { std::ofstream(lock) << "999999\n"; }

  std::string out;
  int rc = RunProgram(StartArgs(d), d.AdminEnv(), &out);
  ASSERT_EQ(rc, 0) << out;
  std::unique_ptr<Client> c2;
  ASSERT_TRUE(Client::Connect(d.client_options(), &c2).ok());
  ServerInfo info;
  ASSERT_TRUE(c2->GetServerInfo(&info).ok());
  EXPECT_NE(info.pid, 0);
  uint32_t sid2;
  ASSERT_TRUE(c2->CreateSession(&sid2).ok());
  std::unique_ptr<Cache> cache2;
  ASSERT_TRUE(c2->OpenCache({.session_id = sid2, .fingerprint = "g"}, &cache2).ok());
  Row row;
  for (uint64_t id = 0; id < 100; ++id) {
    ASSERT_TRUE(m.Put(*cache2, id).ok());
    ASSERT_TRUE(cache2->Get(id, &row).ok());
    ASSERT_EQ(m.Verify(id, row.view()), "");
  }
  cache2.reset();
  c2.reset();

  // The new daemon is not our child (the admin detached it): stop it.
  rc = RunProgram({AdminPath(), "--stop", "-p", std::to_string(d.port())}, d.AdminEnv(),
                  &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_FALSE(Exists(sock));
  EXPECT_TRUE(d.ShmFiles().empty());
  if (info.pid > 0 && kill(info.pid, 0) == 0) kill(info.pid, SIGKILL);
}

TEST(StaleState, SecondStartNeverClobbersALiveInstance) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  SessionCache sc;
  ASSERT_TRUE(OpenSessionCache(d, "f", &sc).ok());
  std::unique_ptr<Client>& c = sc.client;
  const uint32_t sid = sc.session;
  std::unique_ptr<Cache>& cache = sc.cache;
  RowMaker m(1024);
  for (uint64_t id = 0; id < 100; ++id) ASSERT_TRUE(m.Put(*cache, id).ok());
  auto files_before = d.ShmFiles();

  for (int i = 0; i < 3; ++i) {
    std::string out;
    int rc = RunProgram(StartArgs(d), d.AdminEnv(), &out);
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("already running"), std::string::npos) << out;
    EXPECT_NE(out.find(std::to_string(d.pid())), std::string::npos)
        << "the message should name the running process: " << out;
  }
  // The first instance still serves, with everything it had.
  EXPECT_TRUE(d.Alive());
  EXPECT_TRUE(c->CheckSession(sid).ok());
  Row row;
  for (uint64_t id = 0; id < 100; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok());
    ASSERT_EQ(m.Verify(id, row.view()), "");
  }
  ASSERT_TRUE(m.Put(*cache, 100).ok());
  std::unique_ptr<Client> c2;
  ASSERT_TRUE(Client::Connect(d.client_options(), &c2).ok());
  ServerInfo info;
  ASSERT_TRUE(c2->GetServerInfo(&info).ok());
  EXPECT_EQ(info.pid, d.pid());
  auto files_after = d.ShmFiles();
  for (const std::string& f : files_before) {
    EXPECT_NE(std::find(files_after.begin(), files_after.end(), f), files_after.end())
        << f << " was removed by the second start";
  }
  cache.reset();
  c.reset();
  c2.reset();
  EXPECT_TRUE(d.Stop().ok());
}

// The process id the instance lock file names, or 0.
int LockFilePid(const TestDaemon& d) {
  std::ifstream in(fmt::format("{}/shmcached-{}.lock", d.run_dir(), d.port()));
  int pid = 0;
  in >> pid;
  return pid;
}

// The admin's environment for a start held in start-up (test hook) while
// the file `hold` (made here) exists: the server holds its locks but does
// not listen yet.
std::vector<std::string> HeldStartEnv(const TestDaemon& d, const std::string& hold) {
  { std::ofstream(hold) << "hold\n"; }
  std::vector<std::string> env = d.AdminEnv();
  env.push_back("SHMCACHE_TEST_HOLD_START=" + hold);
  return env;
}

// A client of a server still starting (adopting what a killed one left: it
// holds its locks, its socket is the killed one's) is told so; it was told
// that no server runs ("start it", a start that is refused), or, with no
// socket there, that the socket was removed while the server ran ("restart
// it").
TEST(StaleState, AClientOfAServerStillStartingIsToldItIsStarting) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  d.Kill();
  TempDir tmp;
  const std::string hold = tmp.path() + "/hold";
  const std::vector<std::string> env = HeldStartEnv(d, hold);
  pid_t starter = ForkChild([&] {
    std::string out;
    return RunProgram(StartArgs(d), env, &out) == 0 ? 0 : 1;
  });
  ASSERT_TRUE(
      WaitFor([&] { return d.ReadLog().find("start-up held") != std::string::npos; },
              std::chrono::seconds(30)))
      << d.ReadLog();
  const std::string sock = fmt::format("{}/shmcached-{}.sock", d.run_dir(), d.port());
  for (bool socket_left : {true, false}) {
    SCOPED_TRACE(socket_left ? "the killed server's socket" : "no socket");
    if (!socket_left) unlink(sock.c_str());
    std::unique_ptr<Client> c;
    Status s = Client::Connect(d.client_options(), &c);
    EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
    EXPECT_EQ(s.message(),
              fmt::format("the cache server on port {} (process id {}) is still starting "
                          "with run dir {} (it listens on {} once it has set up its "
                          "shared memory): try again in a moment",
                          d.port(), LockFilePid(d), d.run_dir(), sock));
  }
  unlink(hold.c_str());
  int ws = 0;
  ASSERT_TRUE(WaitChild(starter, &ws, std::chrono::seconds(60)));
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << ws;
  std::unique_ptr<Client> c;
  EXPECT_TRUE(Client::Connect(d.client_options(), &c).ok());
  c.reset();
  std::string out;  // the admin started it: the admin stops it
  EXPECT_EQ(RunProgram({AdminPath(), "--stop", "-p", std::to_string(d.port())},
                       d.AdminEnv(), &out),
            0)
      << out;
}

TEST(StaleState, StopEndsAServerThatIsStillStarting) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  RowMaker m(1024);
  uint32_t session = 0;
  {
    SessionCache sc;
    ASSERT_TRUE(OpenSessionCache(d, "f", &sc).ok());
    for (uint64_t id = 0; id < 100; ++id) ASSERT_TRUE(m.Put(*sc.cache, id).ok());
    session = sc.session;
  }
  d.Kill();

  // The next server is held in start-up (test hook) while `hold` exists:
  // it holds the instance lock but does not answer yet.
  TempDir tmp;
  const std::string hold = tmp.path() + "/hold";
  const std::vector<std::string> env = HeldStartEnv(d, hold);
  struct Started {
    int rc;
    char out[2048];
  };
  Started* started = SharedBlock<Started>();
  pid_t starter = ForkChild([&] {
    std::string out;
    started->rc = RunProgram(StartArgs(d), env, &out);
    std::snprintf(started->out, sizeof started->out, "%s", out.c_str());
    return 0;
  });
  ASSERT_TRUE(
      WaitFor([&] { return d.ReadLog().find("start-up held") != std::string::npos; },
              std::chrono::seconds(30)))
      << d.ReadLog();
  const int pid = LockFilePid(d);
  ASSERT_GT(pid, 0);

  std::string out;
  int rc = RunProgram(StartArgs(d), d.AdminEnv(), &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("already running"), std::string::npos) << out;
  EXPECT_NE(out.find("(process id " + std::to_string(pid) + ")"), std::string::npos)
      << out;

  rc = RunProgram({AdminPath(), "--stop", "-p", std::to_string(d.port())}, d.AdminEnv(),
                  &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("still starting"), std::string::npos) << out;
  int ws = 0;
  ASSERT_TRUE(WaitChild(starter, &ws, std::chrono::seconds(30)));
  EXPECT_NE(started->rc, 0) << started->out;
  EXPECT_NE(std::string(started->out).find("stopped by a signal"), std::string::npos)
      << started->out;
  EXPECT_TRUE(Exists(hold)) << "start-up went on instead of stopping";

  // Stopped in start-up, it left what it found for the next start.
  ASSERT_TRUE(d.Restart().ok());
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Connect(d.client_options(), &c).ok());
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(c->OpenCache({.session_id = session, .fingerprint = "f"}, &cache).ok());
  Row row;
  for (uint64_t id = 0; id < 100; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
    ASSERT_EQ(m.Verify(id, row.view()), "");
  }
  cache.reset();
  c.reset();
  EXPECT_TRUE(d.Stop().ok());
}

}  // namespace
}  // namespace shmcache::test
