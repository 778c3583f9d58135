#include "test_server.h"

#include "process_state.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>

extern char** environ;

namespace shmcache::test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string CommandResult::Describe() const {
  return "exit " + std::to_string(exit_code) + "\n--- stdout\n" + out +
         "--- stderr\n" + err;
}

CommandResult RunCommand(const std::vector<std::string>& argv, const Env& env,
                         int timeout_s, int uid) {
  CommandResult r;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    r.err = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  // Build argv/envp before fork: the child only calls async-signal-safe
  // functions.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    std::string s = *e;
    std::string name = s.substr(0, s.find('='));
    bool overridden = std::any_of(env.begin(), env.end(),
                                  [&](const auto& kv) { return kv.first == name; });
    if (!overridden) env_strings.push_back(s);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  std::vector<std::string> args = argv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (std::string& e : env_strings) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) {
    r.err = std::string("fork: ") + std::strerror(errno);
    return r;
  }
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    if (uid >= 0) {
      if (setresgid(static_cast<gid_t>(uid), static_cast<gid_t>(uid),
                    static_cast<gid_t>(uid)) != 0 ||
          setgroups(0, nullptr) != 0 ||
          setresuid(static_cast<uid_t>(uid), static_cast<uid_t>(uid),
                    static_cast<uid_t>(uid)) != 0) {
        _exit(126);
      }
    }
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  bool timed_out = false;
  char buf[4096];
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    int n = poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  if (timed_out) {
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    r.exit_code = -9;
    r.err += "\n[test: command timed out after " + std::to_string(timeout_s) + " s]";
    return r;
  }
  r.exit_code = WaitChild(pid, timeout_s);
  return r;
}

std::string AdminPath() {
  const char* p = std::getenv("SHMCACHE_ADMIN");
  return p ? p : "shmcache";
}

std::string DaemonPath() {
  const char* p = std::getenv("SHMCACHE_DAEMON_BIN");
  return p ? p : "shmcached";
}

std::string MakeTempDir(const std::string& parent, const std::string& prefix) {
  std::string templ = parent + "/" + prefix + ".XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << ": " << std::strerror(errno);
    return "";
  }
  return buf.data();
}

std::string TestTmpRoot() {
  const char* p = std::getenv("SHMCACHE_RUN_DIR");
  if (p && *p && PathExists(p)) return p;
  return "/tmp";
}

void RemoveTree(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds bound) {
  auto deadline = Clock::now() + bound;
  for (;;) {
    if (cond()) return true;
    if (Clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

pid_t ForkChild(const std::function<int()>& body) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 99;
    try {
      rc = body();
    } catch (...) {
      rc = 98;
    }
    fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

int WaitChild(pid_t pid, int timeout_s) {
  if (pid <= 0) return -1;
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int st = 0;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return -1;
    if (Clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -9;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return -WTERMSIG(st);
  return -1;
}

bool ProcessExited(pid_t pid) { return ProcessGone(pid); }

void FillPattern(uint64_t id, uint64_t salt, void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t x = (id + 1) * 0x9E3779B97F4A7C15ULL ^ (salt * 0xD1B54A32D192ED03ULL);
  if (x == 0) x = 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x);
  }
}

std::vector<uint8_t> Pattern(uint64_t id, uint64_t salt, size_t n) {
  std::vector<uint8_t> v(n);
  FillPattern(id, salt, v.data(), n);
  return v;
}

// ---- TestServer --------------------------------------------------------

namespace {

int PickPort(const std::string& run_dir) {
  // Ports only name sockets and files; a private run dir makes any port
  // free. Still, spread them so that shared run dirs do not collide.
  static std::atomic<int> next{0};
  for (;;) {
    int n = next.fetch_add(1);
    int port = 20000 + static_cast<int>((getpid() * 37 + n) % 40000);
    if (!PathExists(run_dir + "/shmcached-" + std::to_string(port) + ".sock") &&
        !PathExists(run_dir + "/shmcached-" + std::to_string(port) + ".lock")) {
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
    shm_dir_ = MakeTempDir("/dev/shm", "shmcache-test");
    own_shm_dir_ = true;
  }
  port_ = options_.port ? options_.port : PickPort(run_dir_);
  std::vector<std::string> args = {"--start", "--shm_dir", shm_dir_,
                                   "--log_dir", run_dir_ + "/log"};
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  start_ = Admin(args);
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
  }
  if (ok() && !killed_) {
    EXPECT_TRUE(ShmFiles().empty())
        << "left in " << shm_dir_ << ": " << testing::PrintToString(ShmFiles());
    EXPECT_FALSE(PathExists(socket_path())) << socket_path();
  }
  if (killed_) {
    for (const std::string& f : ShmFiles()) unlink((shm_dir_ + "/" + f).c_str());
  }
  if (own_shm_dir_) RemoveTree(shm_dir_);
  if (own_run_dir_) RemoveTree(run_dir_);
}

std::string TestServer::socket_path() const {
  return run_dir_ + "/shmcached-" + std::to_string(port_) + ".sock";
}

std::string TestServer::shm_prefix() const {
  return "shmcache." + std::to_string(geteuid()) + "." + std::to_string(port_) + ".";
}

std::vector<std::string> TestServer::ShmFiles() const {
  std::vector<std::string> mine;
  for (const std::string& n : ListDir(shm_dir_)) {
    if (n.rfind(shm_prefix(), 0) == 0) mine.push_back(n);
  }
  return mine;
}

std::string TestServer::ReadLog() const {
  std::string log;
  for (const std::string& n : ListDir(run_dir_ + "/log")) {
    FILE* f = fopen((run_dir_ + "/log/" + n).c_str(), "r");
    char buf[4096];
    size_t r;
    while (f && (r = fread(buf, 1, sizeof buf, f)) > 0) log.append(buf, r);
    if (f) fclose(f);
  }
  return log;
}

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
  o.spilling = spilling;
  return o;
}

}  // namespace shmcache::test
