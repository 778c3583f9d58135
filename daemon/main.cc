// shmcached: the shmcache server. Normally started by `shmcache --start`,
// which passes --ready_fd so that this process can report success or the
// reason of a failure before the admin exits.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>  // before Asio: 1.74 uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>
#include <fmt/format.h>

#include "common/instance_files.h"
#include "common/instance_lock.h"
#include "common/memory_bounds.h"
#include "common/option_checks.h"
#include "common/process_state.h"
#include "daemon/daemon_options.h"
#include "daemon/huge_tmpfs.h"
#include "daemon/logger.h"
#include "daemon/metrics_file.h"
#include "daemon/server.h"
#include "daemon/shm_dir_switch.h"
#include "daemon/shm_pages.h"
#include "daemon/store.h"
#include "daemon/systemd_notify.h"
#include "format/instance.h"
#include "format/numa_topology.h"
#include "format/shm_file.h"
#include "shmcache/version.h"

using namespace shmcache;

namespace {

constexpr size_t kMinShmRoom = 16u << 20;

// The readiness report, on the pipe from `shmcache --start` (or stderr):
// "NOTE <text>" lines, then one "OK <pid> <workers> <log path>" or
// "ERR <why>" line. The log path runs to the end of its line.
void Report(int fd, const std::string& line, const std::vector<std::string>& notes = {}) {
  std::string text;
  for (std::string note : notes) {
    std::replace(note.begin(), note.end(), '\n', ' ');
    text += "NOTE " + note + "\n";
  }
  text += line + "\n";
  if (fd < 0) {
    fmt::print(stderr, "{}", text);
    return;
  }
  for (size_t done = 0; done < text.size();) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the admin is gone: nobody to tell
    done += static_cast<size_t>(n);
  }
  close(fd);
}

int Fail(int fd, const std::string& why) {
  Report(fd, "ERR " + why);
  return 1;
}

// Every client connection costs a descriptor; a soft limit of 1024 would
// turn clients away long before the system must. Returns the limit now.
rlim_t RaiseFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised{r.rlim_max, r.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return r.rlim_max;
  }
  return r.rlim_cur;
}

// The caches' files are as large as the caches: a soft file size limit
// (ulimit -f in the shell that started the server) below them made the
// first segment past it a SIGXFSZ, which ended the server without a word.
// The limit is raised to the hard one, and the signal ignored: a file past
// a hard limit is then an error (EFBIG) that its request reports.
void RaiseFileSizeLimit() {
  signal(SIGXFSZ, SIG_IGN);
  rlimit r{};
  if (getrlimit(RLIMIT_FSIZE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_FSIZE, &r);
  }
}

// Opens the log in the configured directory (default <run dir>/log). A log
// dir another user owns must not stop the server: it then logs in the run
// dir, which is its own, and says why in a note for --start's user (who
// would otherwise look for the log where they asked for it).
Status OpenLog(const DaemonOptions& opts, const InstancePaths& paths, Logger* log,
               std::vector<std::string>* notes) {
  std::string own = paths.run_dir + "/log";
  std::string dir = opts.log_dir.empty() ? own : opts.log_dir;
  Status s = log->Open(dir, opts.log_level);
  if (s.ok() || dir == own) return s;
  if (!log->Open(own, opts.log_level).ok()) return s;
  notes->push_back(
      fmt::format("log directory {} cannot be used ({}); logging in {} instead", dir,
                  s.message(), own));
  log->Warn("{}", notes->back());
  return Status::OK();
}

// Runs the io_context in a worker thread. A handler that throws ends only
// the request it served: the exception is logged and the worker goes on.
void RunWorker(boost::asio::io_context& io, Logger& log) {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      log.Error("a request handler failed: {}; serving on", e.what());
    } catch (...) {
      log.Error("a request handler failed with an unknown exception; serving on");
    }
  }
}

// SIGTERM/SIGINT before the server listens (adoption may take a while):
// start-up stops at the next check and the process exits cleanly, so that
// 'shmcache --stop' can end a server that is still starting.
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void OnStopSignal(int) { g_stop_requested.store(true); }

void CatchStopSignals() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void DetachStdio() {
  int null = open("/dev/null", O_RDWR);
  if (null < 0) return;
  dup2(null, 0);
  dup2(null, 1);
  dup2(null, 2);
  if (null > 2) close(null);
}

// Starts `workers` threads running io. If one cannot be started, the
// others are stopped and joined before the exception goes on.
std::vector<std::thread> StartWorkers(boost::asio::io_context& io, int workers, int nodes,
                                      Logger& log) {
  std::vector<std::thread> threads;
  try {
    for (int i = 0; i < workers; ++i) {
      threads.emplace_back([&io, &log, i, nodes] {
        NumaTopology::Get().PinThreadToNode(i % nodes);
        RunWorker(io, log);
      });
    }
  } catch (...) {
    io.stop();
    for (std::thread& t : threads) t.join();
    throw;
  }
  return threads;
}

// The shm dir the user named (or /dev/shm), or, when SHMCACHE_HUGE_TMPFS
// asks for it, the one ChooseShmDir picks (mounting a huge-page tmpfs when
// it can). After the instance lock: one server of a port mounts at a time.
ShmDirChoice PickShmDir(const DaemonOptions& opts, const InstancePaths& paths) {
  if (ShmDirGiven(opts.shm_dir) || !HugeTmpfsAsked()) {
    ShmPages pages = ShmPagesOf(paths.shm_dir);
    // A dir on a disk works, at the disk's speed: the kernel writes the
    // cache's pages back to it. Said at --start, not only in the log: it
    // was taken silently, and --shm_dir reads like "where to keep a cache".
    std::string note;
    if (pages.disk) {
      note = fmt::format(
          "shm dir {} is on a disk's filesystem ({}): the cache's files there are "
          "written back to that filesystem, and filled and read at its speed; give "
          "--shm_dir a directory on a tmpfs (/dev/shm, the default), or -s DIR for "
          "rows to spill to disk",
          paths.shm_dir, pages.why);
    }
    return {paths.shm_dir, pages.huge, false, ShmPagesNote(paths.shm_dir, pages), note};
  }
  uint64_t cap = MemoryCapBytes(opts.memory_cap_ratio, opts.memory_cap_bytes);
  return ChooseShmDir(paths.port, HugeTmpfsBytes(cap));
}

// What start-up decided before the Store exists, for the rest of Run.
struct Startup {
  ShmDirChoice shm;
  int nodes = 1;
  int workers = 1;
  rlim_t fd_limit = 0;
  std::vector<std::string> notes;  // NOTE lines of the readiness report
};

// The files of the instance in the shm dir chosen: an earlier server's,
// for --stop to count and the next start to adopt.
InstanceFiles InstanceFilesIn(const InstancePaths& paths) {
  return CountInstanceFiles(paths.shm_dir,
                            paths.shm_prefix.substr(paths.shm_dir.size() + 1));
}

// A start refused after it took its locks: the lock files go (when
// `remove_locks`), and so does the huge tmpfs it mounted (or adopted) when
// it was read and nothing of the instance is in it. Left, that mount stayed
// in /dev/shm for good: no lock file named it, so --stop said there was
// nothing to stop.
void ReleaseRefusedStart(const InstancePaths& paths, const Startup& up, bool remove_locks,
                         InstanceLocks* locks, Logger* log) {
  if (up.shm.own_mount) {
    const InstanceFiles in_mount = InstanceFilesIn(paths);
    if (in_mount.listed && in_mount.files == 0) {
      Status r = ReleaseHugeShmDir(up.shm.dir);
      if (!r.ok()) log->Warn("{}", r.message());
    }
  }
  if (remove_locks) locks->RemoveFiles();
}

// Picks the shm dir (moving a killed server's files of the other huge-page
// mode there), sets *paths to it, counts the workers and checks the dir is
// usable. InvalidArgument saying what to change when it is not.
Status PrepareShm(const DaemonOptions& opts, InstancePaths* paths, Logger* log,
                  Startup* up) {
  up->fd_limit = RaiseFileLimit();
  RaiseFileSizeLimit();  // before the first file is moved or made
  // A start refused from here on leaves a mounted tmpfs only with rows in
  // it, for the next start to adopt (ReleaseRefusedStart).
  up->shm = PickShmDir(opts, *paths);
  *paths = MakeInstancePaths(opts.port, opts.run_dir, up->shm.dir);
  struct stat dir {};
  if (stat(paths->shm_dir.c_str(), &dir) == 0 && !S_ISDIR(dir.st_mode)) {
    return Status::InvalidArgument(
        fmt::format("shared-memory directory {} is not a directory; give --shm_dir (or "
                    "SHMCACHE_SHM_DIR) a directory, on a tmpfs",
                    paths->shm_dir));
  }
  // A killed server of the other huge-page mode left its rows in the other
  // place: they move here, and adoption finds them. Also when the shm dir
  // given is /dev/shm: a huge tmpfs of the port is still this instance's.
  std::string why_not_huge = up->shm.why_not_huge;
  if (ShmDirGiven(opts.shm_dir)) {
    why_not_huge = fmt::format(
        "its shm dir is given (--shm_dir or $SHMCACHE_SHM_DIR: {})", up->shm.dir);
  }
  ShmDirSwitch moved = MoveEarlierShmFiles(paths->port, up->shm.dir, up->shm.huge,
                                           why_not_huge, &g_stop_requested, log);
  if (!moved.warning.empty()) up->notes.push_back(moved.warning);

  up->nodes = NumaTopology::Get().num_nodes();
  up->workers = WorkerCount(
      opts.workers, static_cast<int>(std::thread::hardware_concurrency()), up->nodes);
  if (opts.workers > 0 && up->workers != opts.workers) {
    up->notes.push_back(fmt::format(
        "worker count {} is not a multiple of the {} NUMA nodes; it is raised to {}.",
        opts.workers, up->nodes, up->workers));
    log->Warn("{}", up->notes.back());
  }
  if (access(paths->shm_dir.c_str(), W_OK | X_OK) != 0) {
    return Status::InvalidArgument(
        fmt::format("shared-memory directory {} is not writable: {}", paths->shm_dir,
                    std::strerror(errno)));
  }
  const size_t room = FreeBytes(paths->shm_dir);
  if (room < kMinShmRoom) {
    return Status::InvalidArgument(fmt::format(
        "no room in {}: {} MB free, at least {} MB needed; free space there, give "
        "the container a larger --shm-size, or start with --shm_dir DIR",
        paths->shm_dir, room >> 20, kMinShmRoom >> 20));
  }
  return Status::OK();
}

// A host's /dev/shm is often half its memory, below the default 80%: that
// alone is not worth a warning. It is when the user asked for the memory
// (-r, --memory_cap_mb), in a container (64 MB by default in Docker), or
// when the room is too small for real work.
void WarnIfShmTooSmall(const DaemonOptions& opts, const InstancePaths& paths,
                       const MemoryBounds& bounds, Logger* log,
                       std::vector<std::string>* notes) {
  const std::string container = ContainerKind();
  const bool asked =
      opts.memory_cap_bytes != 0 || opts.memory_cap_ratio != kDefaultMemoryCapRatio;
  if (bounds.shm_bytes >= bounds.requested_bytes ||
      !(asked || !container.empty() || bounds.shm_bytes < (1ull << 30))) {
    return;
  }
  const std::string what =
      bounds.requested == std::string(kBoundCapMb)
          ? fmt::format("--memory_cap_mb {}", bounds.requested_bytes >> 20)
          : fmt::format("-r {} of physical memory", opts.memory_cap_ratio);
  notes->push_back(ShmTooSmallRemedy(paths.shm_dir, bounds.shm_bytes,
                                     bounds.requested_bytes, what, container));
  log->Warn("{}", notes->back());
}

// Tests (and scripts) may tie the server's life to theirs, so that a
// crashed test run does not leave servers and their memory behind: every
// 200 ms, the watched process gone stops the server.
class WatchedProcess {
 public:
  WatchedProcess(boost::asio::io_context& io, const ProcessHandle& watched, int pid,
                 Server* server, Logger* log)
      : timer_(io), watched_(watched), pid_(pid), server_(server), log_(log) {}
  void Start() {
    timer_.expires_after(std::chrono::milliseconds(200));
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      if (!watched_.Gone()) return Start();
      log_->Warn("process {} that this server watches is gone: shutting down", pid_);
      server_->RequestStop();
    });
  }

 private:
  boost::asio::steady_timer timer_;
  const ProcessHandle& watched_;
  const int pid_;
  Server* const server_;
  Logger* const log_;
};

// Serves until the server is asked to stop and its workers are done:
// listens (and says so in its host lock), reports ready (opts.ready_fd is -1 afterwards:
// the report closed it) and runs the workers.
Status Serve(DaemonOptions& opts, const InstancePaths& paths,
             const ProcessHandle& watched, Store* store, Logger* log, Startup* up,
             InstanceLocks* locks) {
  boost::asio::io_context io(up->workers);
  Server server(io, store, log, opts);
  Status s = server.Listen(paths.socket_path);
  if (!s.ok()) return s;
  locks->NoteServing();
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    log->Info("signal {}: shutting down", sig);
    server.RequestStop();
  });
  if (g_stop_requested.load()) {  // after adoption, before signal_set: a plain stop
    log->Info("stop signal during start-up: shutting down");
    server.RequestStop();
  }
  signal(SIGPIPE, SIG_IGN);
  WatchedProcess watch(io, watched, opts.watch_pid, &server, log);
  if (opts.watch_pid > 0) watch.Start();
  std::optional<MetricsFile> metrics;
  if (!opts.metrics_file.empty()) {
    metrics.emplace(io, store, log, opts.metrics_file,
                    std::chrono::seconds(opts.metrics_interval_s));
    metrics->Start();
  }
  std::vector<std::thread> threads = StartWorkers(io, up->workers, up->nodes, *log);
  const MemoryBounds& bounds = store->memory_bounds();
  log->Info(
      "started: port {}, socket {}, shm dir {}, {} workers, {} NUMA node(s), "
      "memory cap {} MB, spill dir {}, open files limit {}",
      paths.port, paths.socket_path, paths.shm_dir, up->workers, up->nodes,
      store->memory_cap() >> 20, opts.spill_dir.empty() ? "none" : opts.spill_dir,
      up->fd_limit);
  log->Info("{}", up->shm.log_line);
  log->Info(
      "memory cap bounds: {} {} MB, cgroup {} MB (limit {} MB in {}), shm "
      "filesystem {} MB; {} applies",
      bounds.requested, bounds.requested_bytes >> 20, bounds.cgroup_bytes >> 20,
      bounds.cgroup_limit_bytes >> 20,
      bounds.cgroup_file.empty() ? "none" : bounds.cgroup_file, bounds.shm_bytes >> 20,
      bounds.bound);
  for (const std::string& note : store->startup_notes()) up->notes.push_back(note);
  if (!up->shm.note.empty()) up->notes.push_back(up->shm.note);
  Report(opts.ready_fd, fmt::format("OK {} {} {}", getpid(), up->workers, log->path()),
         up->notes);
  opts.ready_fd = -1;  // Report closed it
  NotifyReady(fmt::format("serving port {}", paths.port));
  if (!opts.foreground) DetachStdio();

  for (std::thread& t : threads) t.join();
  NotifyStopping();
  if (metrics) metrics->Remove();
  return Status::OK();
}

// Everything of main() after the options: set-up, serving, shutdown.
// opts.ready_fd is set to -1 once the readiness line went out.
int Run(DaemonOptions& opts) {
  // Held from the start, so that a process given the watched pid after it
  // is gone is not taken for it.
  ProcessHandle watched(opts.watch_pid);
  // One already gone would stop the server 200 ms after --start reported
  // success.
  if (opts.watch_pid > 0 && watched.Gone()) {
    return Fail(
        opts.ready_fd,
        fmt::format("the process to watch (SHMCACHE_WATCH_PID, --watch_pid) {} is "
                    "not running: the server would stop at once; unset it or set "
                    "it to the pid of a live process",
                    opts.watch_pid));
  }
  InstancePaths paths = MakeInstancePaths(opts.port, opts.run_dir, opts.shm_dir);
  // Before anything is created: a socket path that cannot be bound would
  // otherwise be found only after the shared memory is set up.
  Status s = CheckRunDir(paths.run_dir);
  if (s.ok() && opts.shm_dir.empty()) s = CheckShmDirFromEnv(paths.shm_dir);
  if (s.ok()) s = CheckSocketPath(paths.socket_path);
  if (s.ok()) s = EnsureRunDir(paths.run_dir);
  std::unique_ptr<InstanceLocks> locks;
  if (s.ok()) {
    s = InstanceLocks::Take(paths.lock_path, HostLockPath(paths.port), paths.port,
                            paths.run_dir, &locks);
  }
  if (!s.ok()) return Fail(opts.ready_fd, s.message());
  CatchStopSignals();

  Logger log;
  Startup up;
  s = OpenLog(opts, paths, &log, &up.notes);
  if (s.ok()) s = PrepareShm(opts, &paths, &log, &up);
  if (!s.ok()) {
    // Refused at set-up (a shm dir that is a file, no room): its lock
    // files go too; what an earlier server left stays for the next start.
    ReleaseRefusedStart(paths, up, /*remove_locks=*/true, locks.get(), &log);
    return Fail(opts.ready_fd, s.message());
  }
  // For --stop in another run dir: which shm dir is this server's.
  locks->NoteShmDir(paths.shm_dir);
  Store store(opts, paths, up.nodes, up.workers, &log);
  WarnIfShmTooSmall(opts, paths, store.memory_bounds(), &log, &up.notes);
  s = store.Init(&g_stop_requested);
  if (!s.ok()) {
    log.Info("not started: {}", s.message());
    // The lock files stay only while they name a shm dir with files of
    // this instance in it (an earlier server's, for --stop to count and the
    // next start to adopt); otherwise a refused start would leave them
    // behind in /dev/shm for good.
    ReleaseRefusedStart(paths, up,
                        g_stop_requested.load() || InstanceFilesIn(paths).files == 0,
                        locks.get(), &log);
    return Fail(opts.ready_fd, s.message());
  }
  s = Serve(opts, paths, watched, &store, &log, &up, locks.get());
  if (!s.ok()) return Fail(opts.ready_fd, s.message());
  log.Info("stopping: removing shared memory and socket");
  store.Shutdown();
  if (up.shm.own_mount) {
    Status r = ReleaseHugeShmDir(up.shm.dir);
    if (!r.ok()) log.Warn("{}", r.message());
  }
  unlink(paths.socket_path.c_str());
  locks->RemoveFiles();
  log.Info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  DaemonOptions opts;
  Status s = ParseDaemonOptions(argc, argv, &opts);
  if (!s.ok()) return Fail(opts.ready_fd, s.message());
  if (opts.version) {
    fmt::print("shmcached {}\n", VersionText());
    return 0;
  }
  // Before anything starts: an environment value is refused as a flag is.
  s = CheckHugeTmpfsEnv();
  if (!s.ok()) return Fail(opts.ready_fd, s.message());
  // No exception may end the daemon without a word: the admin waiting on
  // the ready pipe is told, and the exit status says it failed.
  try {
    return Run(opts);
  } catch (const std::exception& e) {
    return Fail(opts.ready_fd, std::string("internal error: ") + e.what());
  } catch (...) {
    return Fail(opts.ready_fd, "internal error: unknown exception");
  }
}
