// What a client of the library is told when no server answers where it
// looks but the port's host lock names one of this user's
// (common/server_elsewhere.h): one that runs with another run dir, or a
// stopped one. The library said "not running; start it with 'shmcache
// --start'" (a start that is refused: one server per user and port) and
// "unreachable (timed out)"; only the admin named the server.
#include <cstdlib>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/support/test_server.h"

namespace shmcache::test {
namespace {

// A run dir of this user's with no server in it; removed at the end.
class OtherRunDir {
 public:
  OtherRunDir() : path_(MakeTempDir(TestTmpRoot(), "elsewhere")) {}
  ~OtherRunDir() { RemoveTree(path_); }
  OtherRunDir(const OtherRunDir&) = delete;
  OtherRunDir& operator=(const OtherRunDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// What a program of the library is told by a connect in `here` on the
// port of `server`, which runs with its own run dir.
std::string ToldElsewhere(const TestServer& server, const std::string& here) {
  return fmt::format(
      "no cache server is running on port {} with run dir {}; a server of yours on "
      "port {} runs with run dir {} (process id {}), and a user has one server per "
      "port: use it by running this process with SHMCACHE_RUN_DIR={}, or stop it with "
      "'SHMCACHE_RUN_DIR={} shmcache --stop -p {}' before starting one here",
      server.port(), here, server.port(), server.run_dir(), server.pid(),
      server.run_dir(), server.run_dir(), server.port());
}

TEST(ServerElsewhere, AClientOfAnotherRunDirIsToldWhichServerRunsOnThePort) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  const OtherRunDir here;
  ClientOptions o;
  o.port = server.port();
  o.run_dir = here.path();
  std::unique_ptr<Client> client;
  Status s = Client::Connect(o, &client);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_EQ(s.message(), ToldElsewhere(server, here.path()));
  // What it says works.
  o.run_dir = server.run_dir();
  EXPECT_TRUE(Client::Connect(o, &client).ok());
}

// A C++ trainer (examples/shard_worker.cc) whose run dir is not the
// server's trains from its source, and its warning names the server.
TEST(ServerElsewhere, ATrainerOfAnotherRunDirWarnsNamingTheServer) {
  const char* worker = std::getenv("SHMCACHE_SHARD_WORKER");
  ASSERT_NE(worker, nullptr);
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  const uint32_t session = server.NewSession();
  const OtherRunDir here;
  CommandResult r =
      RunCommand({worker, "--session_id", std::to_string(session), "--rows", "16",
                  "--epochs", "1", "--port", std::to_string(server.port())},
                 {{"SHMCACHE_RUN_DIR", here.path()}});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.err, fmt::format("device 0: warning: cache unavailable (Unavailable: {}); "
                               "reading from the source\n",
                               ToldElsewhere(server, here.path())))
      << r.Describe();
  EXPECT_NE(r.out.find("0 hits, 16 misses, 0 wrong rows"), std::string::npos)
      << r.Describe();
}

// A server stopped by SIGSTOP (Ctrl-Z, a debugger) accepts connections
// (the kernel's backlog) and answers nothing: a new client is told it is
// stopped and how to resume it, where it said only that it timed out.
TEST(ServerElsewhere, AStoppedServerIsNamedAsStopped) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  {
    const ContinuedAfter resumed(server.pid());
    ASSERT_TRUE(StopProcess(server.pid()));
    ClientOptions o = server.client_options();
    o.request_timeout_ms = 200;
    std::unique_ptr<Client> client;
    Status s = Client::Connect(o, &client);
    EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
    EXPECT_EQ(s.message(),
              fmt::format("the cache server on port {} (process id {}) is stopped "
                          "(SIGSTOP, Ctrl-Z or a debugger) and answers nothing: resume "
                          "it with 'kill -CONT {}', or stop it with 'shmcache --stop -p "
                          "{}'",
                          server.port(), server.pid(), server.pid(), server.port()));
  }
  // Resumed, it answers again.
  std::unique_ptr<Client> client;
  EXPECT_TRUE(server.Connect(&client).ok());
}

}  // namespace
}  // namespace shmcache::test
