#include "rel_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "instance.h"
#include "shmcache/stats.h"

namespace shmcache::reltest {

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

std::string DaemonPath() { return SHMCACHE_TEST_DAEMON; }
std::string AdminPath() { return SHMCACHE_TEST_ADMIN; }

double EnvSeconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  double d = std::strtod(v, nullptr);
  return d > 0 ? d : fallback;
}

bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds bound) {
  auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    if (cond()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string n = e->d_name;
        if (n == "." || n == "..") continue;
        RemoveTree(path + "/" + n);
      }
      closedir(d);
    }
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

TempDir::TempDir(const std::string& parent) {
  std::string tmpl = parent + "/shmcache-rel.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    fmt::print(stderr, "mkdtemp under {}: {}\n", parent, std::strerror(errno));
    std::abort();
  }
  path_ = tmpl;
}

TempDir::~TempDir() { RemoveTree(path_); }

// ---- TestDaemon ----------------------------------------------------------

TestDaemon::TestDaemon() {
  std::random_device rd;
  port_ = 20000 + static_cast<int>(rd() % 40000);
  std::string tmpl = "/tmp/shmcache-reld.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  base_dir_ = tmpl;
  run_dir_ = base_dir_ + "/run";
  log_dir_ = base_dir_ + "/log";
}

TestDaemon::~TestDaemon() {
  if (Alive()) Kill();
  // Remove whatever this instance left, wherever its shm dir is.
  for (const std::string& f : ShmFiles()) unlink(f.c_str());
  if (own_shm_dir_) RemoveTree(shm_dir_);
  // A killed daemon's huge-page tmpfs (a stopped one removed its own).
  if (opts_.default_shm_dir && HugeMounted()) {
    umount2(HugeShmDir(port_).c_str(), UMOUNT_NOFOLLOW | MNT_DETACH);
    rmdir(HugeShmDir(port_).c_str());
  }
  RemoveTree(base_dir_);
}

std::string TestDaemon::shm_prefix() const {
  return fmt::format("shmcache.{}.{}.", opts_.uid != 0 ? opts_.uid : geteuid(), port_);
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
  std::string prefix = shm_prefix();
  if (DIR* d = opendir(shm_dir_.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) {
        out.push_back(shm_dir_ + "/" + e->d_name);
      }
    }
    closedir(d);
  }
  return out;
}

std::string TestDaemon::ReadLog() const {
  std::string all;
  if (DIR* d = opendir(log_dir_.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(log_dir_ + "/" + e->d_name);
      std::stringstream ss;
      ss << in.rdbuf();
      all += ss.str();
    }
    closedir(d);
  }
  return all;
}

std::vector<std::string> TestDaemon::AdminEnv() const {
  return {"SHMCACHE_RUN_DIR=" + run_dir_, "SHMCACHE_DAEMON=" + DaemonPath()};
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
    std::string tmpl = "/dev/shm/shmcache-rel.XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      return Status::FromErrno("mkdtemp /dev/shm", errno);
    }
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
  std::vector<std::string> args = {
      DaemonPath(),
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
    std::vector<char*> cargs;
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
  verdict = verdict.substr(verdict.rfind('\n') == std::string::npos
                               ? 0 : verdict.rfind('\n') + 1);
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

// ---- processes -------------------------------------------------------------

pid_t ForkChild(const std::function<int()>& body) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 1;
    rc = body();
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
  }
  return pid;
}

bool WaitChild(pid_t pid, int* wstatus, std::chrono::milliseconds bound) {
  int st = 0;
  bool done = WaitFor(
      [&] {
        pid_t r = waitpid(pid, &st, WNOHANG);
        return r == pid || (r < 0 && errno == ECHILD);
      },
      bound);
  if (done && wstatus) *wstatus = st;
  return done;
}

std::string DescribeStatus(int st) {
  if (WIFEXITED(st)) return fmt::format("exit {}", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    return fmt::format("signal {} ({})", WTERMSIG(st), strsignal(WTERMSIG(st)));
  }
  return fmt::format("status {}", st);
}

int RunProgram(const std::vector<std::string>& argv,
               const std::vector<std::string>& env, std::string* output,
               std::chrono::milliseconds bound) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    for (const std::string& e : env) putenv(strdup(e.c_str()));
    std::vector<char*> cargs;
    for (const std::string& s : argv) cargs.push_back(strdup(s.c_str()));
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out = ReadUntilClosed(fds[0], bound);
  close(fds[0]);
  if (output) *output = out;
  int st = 0;
  if (!WaitChild(pid, &st, std::chrono::seconds(5))) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return 128 + WTERMSIG(st);
}

void* MapShared(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  return p;
}

// ---- rows ----------------------------------------------------------------

namespace {
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
uint64_t DataHash(const uint8_t* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ULL;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ULL;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ULL;
  return Mix(h ^ n);
}
}  // namespace

uint64_t Checksum(uint64_t id, const uint8_t* data, size_t n) {
  return Mix(id) ^ DataHash(data, n);
}

RowMaker::RowMaker(size_t max_data)
    : max_data_(max_data),
      pool_(max_data * 2 + kSlots * 8),
      offset_(kSlots),
      length_(kSlots),
      slot_sum_(kSlots) {
  uint64_t x = 42;
  for (size_t i = 0; i < pool_.size(); i += 8) {
    x = Mix(x);
    std::memcpy(&pool_[i], &x, std::min<size_t>(8, pool_.size() - i));
  }
  for (size_t s = 0; s < kSlots; ++s) {
    uint64_t r = Mix(s * 7919 + 1);
    length_[s] = static_cast<uint32_t>(8 + r % (max_data_ - 7));
    offset_[s] = static_cast<uint32_t>((r >> 32) % (pool_.size() - max_data_));
    slot_sum_[s] = DataHash(&pool_[offset_[s]], length_[s]);
  }
}

size_t RowMaker::DataBytes(uint64_t id) const { return length_[Slot(id)]; }
const uint8_t* RowMaker::Data(uint64_t id) const {
  return &pool_[offset_[Slot(id)]];
}
uint64_t RowMaker::Sum(uint64_t id) const { return Mix(id) ^ slot_sum_[Slot(id)]; }

size_t RowMaker::EncodedBytes(uint64_t id) const {
  auto pad = [](size_t n) { return (n + 7) & ~size_t{7}; };
  // header + three descriptors (8 + 8 shape + padded name) + data.
  return 16 + 3 * 24 + 8 + 8 + pad(DataBytes(id));
}

Status RowMaker::Put(Cache& cache, uint64_t id, bool* inserted) const {
  static const int64_t kOne[1] = {1};
  uint64_t sum = Sum(id);
  int64_t n[1] = {static_cast<int64_t>(DataBytes(id))};
  ColumnRef cols[3] = {
      {"id", DType::kUInt64, kOne, &id, 8},
      {"data", DType::kUInt8, n, Data(id), DataBytes(id)},
      {"sum", DType::kUInt64, kOne, &sum, 8},
  };
  return cache.Put(id, cols, inserted);
}

static std::string CheckColumns(const RowMaker& m, uint64_t id,
                                const ColumnView* idc, const ColumnView& data,
                                const ColumnView& sum) {
  if (idc) {
    if (idc->dtype != DType::kUInt64 || idc->nbytes != 8) {
      return "column 'id' has the wrong type or size";
    }
    uint64_t got;
    std::memcpy(&got, idc->data, 8);
    if (got != id) return fmt::format("column 'id' holds {}", got);
  }
  if (data.dtype != DType::kUInt8 || data.nbytes != m.DataBytes(id) ||
      data.shape.size() != 1 ||
      data.shape[0] != static_cast<int64_t>(m.DataBytes(id))) {
    return fmt::format("column 'data' has {} bytes, {} expected", data.nbytes,
                       m.DataBytes(id));
  }
  if (sum.dtype != DType::kUInt64 || sum.nbytes != 8) {
    return "column 'sum' has the wrong type or size";
  }
  uint64_t s;
  std::memcpy(&s, sum.data, 8);
  auto* bytes = reinterpret_cast<const uint8_t*>(data.data);
  if (Checksum(id, bytes, data.nbytes) != s) return "checksum mismatch (torn row)";
  if (s != m.Sum(id)) return "stored checksum is not row's";
  if (std::memcmp(bytes, m.Data(id), data.nbytes) != 0) {
    return "data differs from what was written";
  }
  return "";
}

std::string RowMaker::Verify(uint64_t id, const RowView& row) const {
  if (row.num_columns() != 3) {
    return fmt::format("row has {} columns, 3 expected", row.num_columns());
  }
  ColumnView idc = row.column(0), data = row.column(1), sum = row.column(2);
  if (idc.name != "id" || data.name != "data" || sum.name != "sum") {
    return "column names differ";
  }
  return CheckColumns(*this, id, &idc, data, sum);
}

std::string RowMaker::VerifyProjection(uint64_t id, const RowView& row) const {
  if (row.num_columns() != 2) {
    return fmt::format("projection has {} columns, 2 expected", row.num_columns());
  }
  ColumnView sum = row.column(0), data = row.column(1);
  if (sum.name != "sum" || data.name != "data") return "projection order differs";
  return CheckColumns(*this, id, nullptr, data, sum);
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

}  // namespace shmcache::reltest
