#include "tests/support/test_daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "format/instance.h"
#include "shmcache/stats.h"

namespace shmcache::test {

namespace {
// Everything `fd` yields until its writers close it or `bound` passes.
std::string ReadUntilClosed(int fd, std::chrono::milliseconds bound) {
  std::string out;
  char buf[4096];
  auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) == 0) break;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}
}  // namespace

TestDaemon::TestDaemon() {
  std::random_device rd;
  // Not one another test run on the host holds (its host lock or files).
  do {
    port_ = 20000 + static_cast<int>(rd() % 40000);
  } while (PortTakenOnHost(port_));
  std::string tmpl = "/tmp/" + TaggedPrefix("shmcache-reld") + ".XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  RemovedIfThisProcessDies(tmpl);
  base_dir_ = tmpl;
  run_dir_ = base_dir_ + "/run";
  log_dir_ = base_dir_ + "/log";
}

TestDaemon::~TestDaemon() {
  if (Alive()) Kill();
  // What a killed daemon left, wherever its shm dir is: its files, its
  // huge-page tmpfs, and its host lock, last (a stopped one removed all).
  RemoveKilledInstance(fmt::format("/dev/shm/.shmcache.{}.{}.lock",
                                   opts_.uid != 0 ? opts_.uid : geteuid(), port_),
                       [&] {
                         for (const std::string& f : ShmFiles()) unlink(f.c_str());
                         if (opts_.default_shm_dir && HugeMounted()) {
                           umount2(HugeShmDir(port_).c_str(),
                                   UMOUNT_NOFOLLOW | MNT_DETACH);
                           rmdir(HugeShmDir(port_).c_str());
                         }
                       });
  if (own_shm_dir_) RemoveTree(shm_dir_);
  RemoveTree(base_dir_);
}

std::string TestDaemon::shm_prefix() const {
  return InstancePrefix(opts_.uid != 0 ? opts_.uid : geteuid(), port_);
}

ClientOptions TestDaemon::client_options() const {
  ClientOptions o;
  o.port = port_;
  o.run_dir = run_dir_;
  o.request_timeout_ms = 5000;
  return o;
}

bool TestDaemon::HugeMounted() const {
  std::ifstream in("/proc/self/mountinfo");
  std::string want = fmt::format(" {} ", HugeShmDir(port_));
  for (std::string line; std::getline(in, line);) {
    if (line.find(want) != std::string::npos) return true;
  }
  return false;
}

std::vector<std::string> TestDaemon::ShmFiles() const {
  std::vector<std::string> out;
  if (shm_dir_.empty()) return out;
  for (const std::string& n : InstanceFiles(shm_dir_, shm_prefix())) {
    out.push_back(shm_dir_ + "/" + n);
  }
  return out;
}

std::string TestDaemon::ReadLog() const { return ReadFilesIn(log_dir_); }

std::vector<std::string> TestDaemon::AdminEnv() const {
  // A server the admin starts with it watches this process, as the
  // TestDaemon does.
  return {"SHMCACHE_RUN_DIR=" + run_dir_, "SHMCACHE_DAEMON=" + DaemonPath(),
          fmt::format("SHMCACHE_WATCH_PID={}", getpid())};
}

Status TestDaemon::Start(const Options& o) {
  opts_ = o;
  if (o.uid != 0) {
    if (chown(base_dir_.c_str(), o.uid, o.uid) != 0) {
      return Status::FromErrno("chown " + base_dir_, errno);
    }
  }
  if (o.default_shm_dir) {
    Status s = Spawn();
    if (!s.ok()) return s;
    // Where it put its files: what it tells clients (or, when it runs as
    // another user and refuses this one, where it would mount).
    shm_dir_ = HugeMounted() ? HugeShmDir(port_) : "/dev/shm";
    std::unique_ptr<Client> c;
    ServerInfo info;
    if (Client::Connect(client_options(), &c).ok() && c->GetServerInfo(&info).ok()) {
      shm_dir_ = info.shm_dir;
    }
    return Status::OK();
  }
  if (o.shm_dir.empty()) {
    std::string tmpl = "/dev/shm/" + TaggedPrefix("shmcache-rel") + ".XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      return Status::FromErrno("mkdtemp /dev/shm", errno);
    }
    RemovedIfThisProcessDies(tmpl);
    shm_dir_ = tmpl;
    own_shm_dir_ = true;
  } else {
    shm_dir_ = o.shm_dir;
  }
  return Spawn();
}

Status TestDaemon::Restart() {
  if (Alive()) return Status::AlreadyExists("daemon still running");
  return Spawn();
}

Status TestDaemon::Spawn() {
  std::vector<std::string> args = {DaemonPath(),
                                   fmt::format("--port={}", port_),
                                   "--run_dir=" + run_dir_,
                                   "--log_dir=" + log_dir_,
                                   fmt::format("--workers={}", opts_.workers),
                                   "--loglevel=1",
                                   "--foreground"};
  if (!opts_.default_shm_dir) args.push_back("--shm_dir=" + shm_dir_);
  if (opts_.memory_cap_mb) {
    args.push_back(fmt::format("--memory_cap_mb={}", opts_.memory_cap_mb));
  }
  args.insert(args.end(), opts_.extra_args.begin(), opts_.extra_args.end());
  const rlimit fd_limit{static_cast<rlim_t>(opts_.fd_limit),
                        static_cast<rlim_t>(opts_.fd_limit)};
  // Ends with this process, however it ends: a crashed test, or one meson
  // killed on timeout, would leave it holding meson's output pipe.
  const pid_t owner = getpid();
  args.push_back(fmt::format("--watch_pid={}", owner));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
  args.push_back(fmt::format("--ready_fd={}", fds[1]));
  pid_t pid = fork();
  if (pid < 0) return Status::FromErrno("fork", errno);
  if (pid == 0) {
    fcntl(fds[1], F_SETFD, 0);
    if (opts_.fd_limit > 0 && setrlimit(RLIMIT_NOFILE, &fd_limit) != 0) _exit(126);
    if (opts_.default_shm_dir) unsetenv("SHMCACHE_SHM_DIR");
    for (std::string& e : opts_.extra_env) putenv(e.data());
    if (opts_.uid != 0 && (setgroups(0, nullptr) != 0 || setgid(opts_.uid) != 0 ||
                           setuid(opts_.uid) != 0)) {
      _exit(125);
    }
    // A daemon stopped (SIGSTOP) when its owner dies cannot see its watch:
    // the owner's death sends it SIGCONT, and its watch then stops it
    // cleanly. SIGCONT, not SIGKILL: the "parent" whose death sends it is
    // the forking thread, whose end alone must not end the daemon. Set
    // after setuid, which clears it; an owner dead before it was set is
    // seen by getppid().
    if (prctl(PR_SET_PDEATHSIG, SIGCONT) != 0 || getppid() != owner) _exit(124);
    std::vector<char*> cargs;
    cargs.reserve(args.size() + 1);
    for (std::string& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  close(fds[1]);
  std::string line = ReadUntilClosed(fds[0], std::chrono::seconds(30));
  close(fds[0]);
  // "NOTE ..." lines may come first; the verdict is the last line.
  std::string verdict = line;
  while (!verdict.empty() && verdict.back() == '\n') verdict.pop_back();
  verdict = verdict.substr(
      verdict.rfind('\n') == std::string::npos ? 0 : verdict.rfind('\n') + 1);
  if (verdict.rfind("OK ", 0) != 0) {
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    return Status::IOError("daemon did not start: " + line);
  }
  pid_ = pid;
  return Status::OK();
}

bool TestDaemon::Alive() {
  if (pid_ <= 0) return false;
  int st;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void TestDaemon::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int st;
  waitpid(pid_, &st, 0);
  pid_ = -1;
}

Status TestDaemon::Stop() {
  if (!Alive()) return Status::OK();
  std::unique_ptr<Client> c;
  Status s = Client::Connect(client_options(), &c);
  if (s.ok()) s = c->StopServer();
  c.reset();
  int st = 0;
  if (!WaitChild(pid_, &st, std::chrono::seconds(20))) {
    Kill();
    return Status::Unavailable("daemon did not stop within 20 s; killed");
  }
  pid_ = -1;
  return s;
}

Status OpenSessionCache(const TestDaemon& d, const std::string& fingerprint,
                        SessionCache* out) {
  Status s = Client::Connect(d.client_options(), &out->client);
  if (s.ok()) s = out->client->CreateSession(&out->session);
  if (!s.ok()) return s;
  CacheOptions o;
  o.session_id = out->session;
  o.fingerprint = fingerprint;
  return out->client->OpenCache(o, &out->cache);
}

bool RunnableBy(uid_t uid, const std::string& path) {
  pid_t p = ForkChild([&] {
    bool ok = setgroups(0, nullptr) == 0 && setgid(uid) == 0 && setuid(uid) == 0 &&
              access(path.c_str(), X_OK) == 0;
    return ok ? 0 : 1;
  });
  int st = 0;
  return WaitChild(p, &st, std::chrono::seconds(20)) && WIFEXITED(st) &&
         WEXITSTATUS(st) == 0;
}

}  // namespace shmcache::test
