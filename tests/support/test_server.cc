#include "tests/support/test_server.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <regex>

#include <gtest/gtest.h>

#include "format/instance.h"

namespace shmcache::test {

namespace {

int PickPort(const std::string& run_dir) {
  // Ports only name sockets and files; a private run dir makes any port
  // free. Still, spread them so that shared run dirs do not collide.
  static std::atomic<int> next{0};
  for (;;) {
    int n = next.fetch_add(1);
    int port = 20000 + static_cast<int>((getpid() * 37 + n) % 40000);
    // The host lock makes a port one live instance per user on the host,
    // whatever the run dir: skip ports other test runs hold.
    if (!PathExists(run_dir + "/shmcached-" + std::to_string(port) + ".sock") &&
        !PathExists(run_dir + "/shmcached-" + std::to_string(port) + ".lock") &&
        !PortTakenOnHost(port)) {
      return port;
    }
  }
}

}  // namespace

TestServer::TestServer(ServerOptions options) : options_(std::move(options)) {
  run_dir_ = options_.run_dir;
  if (run_dir_.empty()) {
    run_dir_ = MakeTempDir(TestTmpRoot(), "srv");
    own_run_dir_ = true;
  }
  shm_dir_ = options_.shm_dir;
  if (shm_dir_.empty()) {
    shm_dir_ = MakeTempDir("/dev/shm", TaggedPrefix("shmcache-test"));
    own_shm_dir_ = true;
  }
  port_ = options_.port ? options_.port : PickPort(run_dir_);
  std::vector<std::string> args = {"--start", "--shm_dir", shm_dir_};
  if (!options_.default_log_dir) {
    args.insert(args.end(), {"--log_dir", run_dir_ + "/log"});
  }
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  start_ = Admin(args);
  // Another test run on the host may have started a server on the port
  // after PickPort saw it free: move on to another port then.
  for (int tries = 0; !options_.port && tries < 20 && start_.exit_code != 0 &&
                      start_.err.find("already running on port") != std::string::npos;
       ++tries) {
    port_ = PickPort(run_dir_);
    start_ = Admin(args);
  }
  std::smatch m;
  static const std::regex kPid("process id ([0-9]+)");
  if (start_.exit_code == 0 && std::regex_search(start_.out, m, kPid)) {
    pid_ = std::stoi(m[1]);
  }
  if (!ok()) {
    ADD_FAILURE() << "cannot start a test server: " << start_.Describe();
  }
}

TestServer::~TestServer() {
  if (ok() && !stopped_ && !killed_) {
    CommandResult r = Stop();
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    // One that did not stop (left stopped by SIGSTOP, or hung) must not
    // outlive the test either.
    if (!ProcessExited(pid_)) Kill();
  }
  if (ok() && !killed_) {
    EXPECT_TRUE(ShmFiles().empty())
        << "left in " << shm_dir_ << ": " << testing::PrintToString(ShmFiles());
    EXPECT_FALSE(PathExists(socket_path())) << socket_path();
  }
  if (killed_) {
    // What a killed daemon leaves (a stopped one removes it): its files,
    // then its host lock.
    RemoveKilledInstance(HostLockPath(port_), [&] {
      for (const std::string& f : ShmFiles()) unlink((shm_dir_ + "/" + f).c_str());
    });
  }
  if (own_shm_dir_) RemoveTree(shm_dir_);
  if (own_run_dir_) RemoveTree(run_dir_);
}

std::string TestServer::socket_path() const {
  return run_dir_ + "/shmcached-" + std::to_string(port_) + ".sock";
}

std::string TestServer::shm_prefix() const { return InstancePrefix(geteuid(), port_); }

std::vector<std::string> TestServer::ShmFiles() const {
  return InstanceFiles(shm_dir_, shm_prefix());
}

std::string TestServer::ReadLog() const { return ReadFilesIn(run_dir_ + "/log"); }

Env TestServer::AdminEnv() const {
  Env env = options_.env;
  env.emplace_back("SHMCACHE_RUN_DIR", run_dir_);
  // A server started here stops by itself if this test process dies.
  env.emplace_back("SHMCACHE_WATCH_PID", std::to_string(getpid()));
  return env;
}

ClientOptions TestServer::client_options() const {
  ClientOptions o;
  o.port = port_;
  o.run_dir = run_dir_;
  return o;
}

Status TestServer::Connect(std::unique_ptr<Client>* out) const {
  return Client::Connect(client_options(), out);
}

uint32_t TestServer::NewSession() const {
  std::unique_ptr<Client> c;
  Status s = Connect(&c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return 0;
  uint32_t id = 0;
  s = c->CreateSession(&id);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return id;
}

CommandResult TestServer::Admin(std::vector<std::string> args) const {
  std::vector<std::string> argv = {AdminPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("-p");
  argv.push_back(std::to_string(port_));
  return RunCommand(argv, AdminEnv());
}

CommandResult TestServer::Stop() {
  stopped_ = true;
  CommandResult r = Admin({"--stop"});
  if (r.exit_code == 0 && pid_ > 0) {
    EXPECT_TRUE(WaitFor([&] { return ProcessExited(pid_); }))
        << "daemon " << pid_ << " still alive after --stop";
  }
  return r;
}

void TestServer::Kill() {
  if (pid_ <= 0) return;
  killed_ = true;
  kill(pid_, SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return ProcessExited(pid_); }))
      << "daemon " << pid_ << " survived SIGKILL";
}

ServerOptions WithArgs(std::vector<std::string> args) {
  ServerOptions o;
  o.extra_args = std::move(args);
  return o;
}

ServerOptions SameInstance(const TestServer& first, std::vector<std::string> args) {
  ServerOptions o = WithArgs(std::move(args));
  o.port = first.port();
  o.run_dir = first.run_dir();
  o.shm_dir = first.shm_dir();
  return o;
}

CacheOptions CacheNamed(uint32_t session, const std::string& name, uint64_t size_mb,
                        bool spilling) {
  CacheOptions o;
  o.session_id = session;
  o.name = name;
  o.fingerprint = name + "-fp";
  o.size_mb = size_mb;
  o.spill_requested = spilling;
  return o;
}

}  // namespace shmcache::test
