#include "daemon/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "daemon/adoption.h"
#include "daemon/logger.h"
#include "format/shm_file.h"

namespace shmcache {

// Bytes the instance's files in the shm dir take now: what an earlier
// server left is adopted, so its room counts as the shm filesystem's.
// Their allocated pages (st_blocks), not their sizes: segments are sparse
// (pages are supplied a step ahead of the carve mark) and the free room
// leaves their holes out already, so free room + this is the room the
// earlier server had at its start, however much it supplied; sizes would
// count the holes twice and let the cap pass the filesystem. Adoption
// reserves the segments at their full sizes against that cap, as their
// maker did: a restart comes back with the cap and the use it had.
static uint64_t InstanceShmBytes(const InstancePaths& paths) {
  std::string prefix = paths.shm_prefix.substr(paths.shm_prefix.rfind('/') + 1);
  uint64_t total = 0;
  DIR* d = opendir(paths.shm_dir.c_str());
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (std::string_view(e->d_name).rfind(prefix, 0) != 0) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISREG(st.st_mode)) {
      total += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  closedir(d);
  return total;
}

// The CPUs this process may run on (its affinity mask, which a cgroup's
// cpuset or taskset narrows), or what the system says it has.
static int CpusOfThisProcess() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

Store::Store(const DaemonOptions& options, const InstancePaths& paths, int num_nodes,
             int workers, Logger* log)
    : options_(options),
      paths_(paths),
      shm_pages_(ShmPagesOf(paths.shm_dir)),
      num_nodes_(num_nodes),
      workers_(workers),
      log_(log),
      rng_(std::random_device{}()),
      spiller_(paths, log),
      stages_(paths) {
  bounds_ = ComputeMemoryBounds(options.memory_cap_ratio, options.memory_cap_bytes,
                                FreeBytes(paths.shm_dir) + InstanceShmBytes(paths));
  account_.cap = bounds_.cap_bytes;
}

Store::~Store() { StopPreparer(); }

std::string Store::WhatThrew(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& thrown) {
    return thrown.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

Status Store::Init(const std::atomic<bool>* stop_requested) {
  auto note = [this](const std::string& text) { Note(text); };
  Status s = spiller_.Open(options_.spill_dir, note);
  if (!s.ok()) return s;
  {
    // Nothing else runs yet, but the state adopted is the same that mu_
    // guards from here on.
    MutexLock lock(&mu_);
    Adoption adoption(paths_, num_nodes_, options_.watch_pid, &spiller_, log_, note);
    Adopted adopted;
    const bool done = adoption.Run(stop_requested, &account_, &adopted);
    sessions_ = std::move(adopted.sessions);
    caches_ = std::move(adopted.caches);
    if (!done) {
      return Status::Unavailable(
          "stopped by a signal while starting; what an earlier server left is "
          "kept for the next start");
    }
    s = ClaimFileNames();
    if (!s.ok()) return s;
    spiller_.Reconcile(caches_, note);
    s = WriteSessionsFile();
    if (!s.ok()) return s;
  }
  preparer_threads_ = std::clamp(CpusOfThisProcess(), 1, SegmentAllocator::kMaxParallel);
  for (int i = 0; i < preparer_threads_; ++i) {
    preparers_.emplace_back([this, i] { PrepareSegments(/*polls=*/i == 0); });
  }
  return Status::OK();
}

uint32_t Store::NewClientId() {
  MutexLock lock(&mu_);
  return next_client_id_++;
}

void Store::Note(const std::string& text) {
  log_->Warn("{}", text);
  notes_.push_back(text);
}

void Store::FillServerInfo(ServerInfo* out) {
  MutexLock lock(&mu_);
  out->instance = fmt::format("port {}", paths_.port);
  out->port = paths_.port;
  out->socket_path = paths_.socket_path;
  out->shm_dir = paths_.shm_dir;
  out->shm_huge_pages = shm_pages_.huge;
  out->shm_pages = shm_pages_.why;
  out->pid = getpid();
  out->workers = workers_;
  out->log_level = options_.log_level;
  out->log_path = log_->path();
  out->spill_dir = options_.spill_dir;
  out->memory_cap_bytes = account_.cap;
  out->memory_used_bytes = account_.used;
  out->memory_held_bytes = held_.bytes();
  out->memory_requested_bytes = bounds_.requested_bytes;
  out->memory_requested_bound = bounds_.requested;
  out->memory_cgroup_bytes = bounds_.cgroup_bytes;
  out->memory_cgroup_limit_bytes = bounds_.cgroup_limit_bytes;
  out->memory_shm_bytes = bounds_.shm_bytes;
  out->memory_cap_bound = bounds_.bound;
  out->numa_nodes = num_nodes_;
  out->sessions.clear();
  for (const auto& [sid, cids] : sessions_) out->sessions.push_back(sid);
  out->connections = static_cast<uint64_t>(std::max<int64_t>(0, connections_.load()));
  out->start_time_unix = started_unix_;
  out->uptime_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

void Store::Shutdown() {
  StopPreparer();
  MutexLock lock(&mu_);
  stages_.ReleaseAll();
  for (auto& [id, c] : caches_) c->Destroy(&account_);
  caches_.clear();
  sessions_.clear();
  // A list left behind would bring its sessions back (empty) at the next
  // start: say so.
  if (Status s = ShmFile::Unlink(paths_.SessionsFile()); !s.ok()) {
    log_->Warn("{}; the next start lists its sessions again", s.message());
  }
  spiller_.Shutdown();
}

}  // namespace shmcache
