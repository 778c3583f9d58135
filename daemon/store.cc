#include "store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <set>

#include "cache_name.h"
#include "logger.h"
#include "process_state.h"
#include "replace_file.h"
#include "spill_record.h"

namespace shmcache {

Store::Store(const DaemonOptions& options, const InstancePaths& paths,
             int num_nodes, int workers, Logger* log)
    : options_(options),
      paths_(paths),
      shm_pages_(ShmPagesOf(paths.shm_dir)),
      num_nodes_(num_nodes),
      workers_(workers),
      log_(log),
      rng_(std::random_device{}()) {
  account_.cap = MemoryCapBytes(options.memory_cap_ratio, options.memory_cap_bytes);
}

Store::~Store() { StopPreparer(); }

void Store::StopPreparer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  jobs_cv_.notify_all();
  job_done_cv_.notify_all();
  if (preparer_.joinable()) preparer_.join();
}

void Store::PrepareSegments() {
  std::unique_lock lock(mu_);
  for (;;) {
    auto ready = [&] { return stopping_ || !jobs_.empty(); };
    auto polling = [&] { return !pending_releases_.empty() || !held_.empty(); };
    if (!polling()) {
      jobs_cv_.wait(lock, [&] { return ready() || polling(); });
    } else {
      jobs_cv_.wait_for(lock, std::chrono::milliseconds(20), ready);
      RetryReleasesLocked();
      if (held_.ScanDue(std::chrono::steady_clock::now())) {
        lock.unlock();
        SettleHeldMemory();
        lock.lock();
      }
    }
    if (stopping_) return;
    if (jobs_.empty()) continue;
    SegmentJob job = jobs_.front();
    jobs_.pop_front();
    running_job_cache_ = job.cache_id;
    lock.unlock();
    ShmFile file;
    Status made = CacheState::CreateSegmentFile(paths_, job.cache_id, job.seg_no,
                                                job.node, job.size, &file);
    lock.lock();
    running_job_cache_ = 0;
    auto it = caches_.find(job.cache_id);
    if (it == caches_.end()) {  // destroyed meanwhile; its memory was released
      file.Unmap();
      ShmFile::Unlink(paths_.SegmentFile(job.cache_id, job.seg_no)).PermitUncheckedError();
      job_done_cv_.notify_all();
      continue;
    }
    it->second->FinishSegmentJob(job, made, std::move(file), &account_);
    job_done_cv_.notify_all();
  }
}

Status Store::Init(const std::atomic<bool>* stop_requested) {
  std::string refused;
  const std::string recorded = ReadSpillRecord(paths_, &refused);
  if (!refused.empty()) {
    // Without a record the adopted spilled rows count as unreadable.
    Note("ignored the spill record: " + refused);
    unlink(paths_.SpillRecordFile().c_str());
  }
  if (!options_.spill_dir.empty()) {
    Status s = SpillStore::Open(SpillDbPath(options_.spill_dir, paths_.port), &spill_);
    if (!s.ok()) return s;
  }
  if (!AdoptExisting(stop_requested)) {
    return Status::Unavailable(
        "stopped by a signal while starting; what an earlier server left is "
        "kept for the next start");
  }
  ReconcileSpill(recorded);
  WriteSessionsFile();
  preparer_ = std::thread([this] { PrepareSegments(); });
  return Status::OK();
}

void Store::DiscardCacheFiles(uint32_t cache_id,
                              const std::vector<std::string>& files,
                              const std::string& why) {
  Note(fmt::format("cache {} left by the earlier server was discarded: {}", cache_id,
                   why));
  for (const std::string& f : files) unlink(f.c_str());
  if (spill_) spill_->DropCache(cache_id).PermitUncheckedError();
}

namespace {

// What the shm dir holds of one cache.
struct FoundCache {
  bool header = false;
  std::set<uint32_t> segments;
  std::vector<std::pair<uint32_t, uint32_t>> tables;  // (gen, tag)
  std::vector<std::string> files;                     // every path
};

// This instance's files, by cache, from one listing of the shm dir. Names
// no server of this layout writes (other layouts, cache id 0, segment
// numbers no location can hold, leftovers) are strays: removed here, never
// opened.
std::map<uint32_t, FoundCache> ListInstanceFiles(const InstancePaths& paths,
                                                 Logger* log) {
  std::map<uint32_t, FoundCache> found;
  const std::string& dir = paths.shm_dir;
  std::string base = paths.shm_prefix.substr(dir.size() + 1);
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return found;
  std::vector<std::string> strays;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, base.c_str(), base.size()) != 0) continue;
    std::string path = dir + "/" + e->d_name;
    ShmName n = ParseShmName(e->d_name + base.size());
    using Kind = ShmName::Kind;
    if (n.kind == Kind::kSessions || n.kind == Kind::kSpillRecord ||
        n.kind == Kind::kHugeDir) {
      continue;  // not a cache's; the huge dir is another server's shm dir
    }
    if (n.kind == Kind::kOther || n.cache_id == 0 ||
        (n.kind == Kind::kSegment && n.number > layout::kMaxSegmentId)) {
      strays.push_back(path);
      continue;
    }
    FoundCache& f = found[n.cache_id];
    f.files.push_back(path);
    if (n.kind == Kind::kCache) f.header = true;
    if (n.kind == Kind::kTable) f.tables.emplace_back(n.number, n.tag);
    if (n.kind == Kind::kSegment) f.segments.insert(n.number);
  }
  closedir(d);
  for (const std::string& f : strays) {
    log->Warn("removing {}: not a file this server writes", f);
    ShmFile::Unlink(f).PermitUncheckedError();
  }
  return found;
}

// Test hook: with $SHMCACHE_TEST_HOLD_START naming a file, start-up waits
// here while that file exists, so that a test can act on a server that is
// still starting. A stop request, or the end of the process the server
// watches (--watch_pid), ends the wait.
void TEST_HoldStart(const std::atomic<bool>* stop_requested, int watch_pid,
                    Logger* log) {
  const char* hold = std::getenv("SHMCACHE_TEST_HOLD_START");
  if (hold == nullptr || *hold == '\0' || access(hold, F_OK) != 0) return;
  log->Info("test hook SHMCACHE_TEST_HOLD_START: start-up held while {} exists", hold);
  while (access(hold, F_OK) == 0 && !(stop_requested && stop_requested->load()) &&
         !(watch_pid > 0 && ProcessGone(watch_pid))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

void Store::ReadSessionsFile() {
  int fd = -1;
  Status s = OpenOwnedFile(paths_.SessionsFile(), O_RDONLY, &fd);
  if (s.IsNotFound()) return;
  if (!s.ok()) {
    log_->Warn("ignoring the list of sessions: {}", s.message());
    ShmFile::Unlink(paths_.SessionsFile()).PermitUncheckedError();
    return;
  }
  FILE* f = fdopen(fd, "r");
  if (f == nullptr) {
    close(fd);
    return;
  }
  unsigned long id;
  while (std::fscanf(f, "%lu", &id) == 1) {
    if (id != 0 && id <= UINT32_MAX) sessions_[static_cast<uint32_t>(id)];
  }
  fclose(f);
}

bool Store::AdoptExisting(const std::atomic<bool>* stop_requested) {
  std::map<uint32_t, FoundCache> found = ListInstanceFiles(paths_, log_);
  ReadSessionsFile();  // sessions, including those without caches
  TEST_HoldStart(stop_requested, options_.watch_pid, log_);
  size_t rows = 0;
  for (auto& [id, f] : found) {
    if (stop_requested && stop_requested->load()) return false;
    if (!f.header) {
      DiscardCacheFiles(id, f.files, "its header file is missing");
      continue;
    }
    std::unique_ptr<CacheState> c;
    Status s = CacheState::Adopt(paths_, id, f.segments, num_nodes_, &account_,
                                 log_, &c);
    if (!s.ok()) {
      DiscardCacheFiles(id, f.files, s.message());
      continue;
    }
    for (const auto& [gen, tag] : f.tables) {
      if (c->UsesTable(gen, tag)) continue;
      std::string path = paths_.TableFile(id, gen, tag);
      log_->Warn("removing {}: cache {} does not use it", path, id);
      ShmFile::Unlink(path).PermitUncheckedError();
    }
    CacheStats st = c->Stats();
    rows += st.mem_rows + st.disk_rows;
    sessions_[c->session_id()].push_back(id);
    caches_[id] = std::move(c);
  }
  if (spill_) {
    for (uint32_t id : spill_->CacheIds()) {
      if (caches_.count(id) == 0) {
        Note(fmt::format("the spilled rows of cache {} were dropped: its memory "
                         "state is gone", id));
        spill_->DropCache(id).PermitUncheckedError();
      }
    }
  }
  if (!caches_.empty() || !sessions_.empty()) {
    log_->Info("adopted {} session(s) and {} cache(s) with {} rows from an earlier "
               "server on port {}",
               sessions_.size(), caches_.size(), rows, paths_.port);
  }
  return !(stop_requested && stop_requested->load());
}

uint32_t Store::NewClientId() {
  std::lock_guard lock(mu_);
  return next_client_id_++;
}

void Store::WriteSessionsFile() {
  // A plain file beside the segments: lists live sessions for a restarted
  // daemon and for people looking at /dev/shm; 0600, the only mode the next
  // server reads.
  std::string text;
  for (const auto& [id, caches] : sessions_) text += fmt::format("{}\n", id);
  ReplaceFile(paths_.SessionsFile(), text, 0600).PermitUncheckedError();
}

Status Store::CreateSession(uint32_t* id) {
  std::lock_guard lock(mu_);
  if (sessions_.size() >= layout::kMaxSessions) {
    return Status::Full("too many sessions; destroy some with 'shmcache -d ID'");
  }
  uint32_t s;
  do {
    s = rng_();
  } while (s == 0 || sessions_.count(s) != 0);
  sessions_[s] = {};
  WriteSessionsFile();
  log_->Info("session {} created", s);
  *id = s;
  return Status::OK();
}

static Status NoSession(uint32_t id) {
  return Status::NotFound(fmt::format(
      "session {} does not exist; list them with 'shmcache --list_sessions' or "
      "create one with 'shmcache -g'",
      id));
}

Status Store::DestroySession(uint32_t id) {
  std::unique_lock lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return NoSession(id);
  // No segment of the session may appear after destroy returns: let a
  // running job for one of its caches finish first (holding the lock from
  // then on, no other starts), and drop the queued ones.
  const std::vector<uint32_t> cids = it->second;
  auto ours = [&](uint32_t cid) {
    return std::find(cids.begin(), cids.end(), cid) != cids.end();
  };
  job_done_cv_.wait(lock, [&] { return !ours(running_job_cache_); });
  std::erase_if(jobs_, [&](const SegmentJob& j) { return ours(j.cache_id); });
  it = sessions_.find(id);
  if (it == sessions_.end()) return NoSession(id);  // destroyed meanwhile
  std::vector<HeldFile> held;
  for (uint32_t cid : it->second) {
    auto c = caches_.find(cid);
    if (c == caches_.end()) continue;
    c->second->Destroy(&account_, &held);
    caches_.erase(c);
    if (spill_) {
      Status s = spill_->DropCache(cid);
      if (!s.ok()) log_->Warn("cache {}: cannot drop spilled rows: {}", cid, s.message());
    }
  }
  sessions_.erase(it);
  WriteSessionsFile();
  log_->Info("session {} destroyed", id);
  held_.Add(id, held, std::chrono::steady_clock::now());
  ResumeCachesLocked();
  lock.unlock();
  jobs_cv_.notify_one();  // the background thread re-checks what stays held
  SettleHeldMemory();
  return Status::OK();
}

void Store::SettleHeldMemory() {
  std::vector<FileId> wanted;
  std::vector<int> first;
  {
    std::lock_guard lock(mu_);
    if (held_.empty()) return;
    wanted = held_.Wanted();
    first = held_.holders();
  }
  MappedScan scan = FindMappedDeleted(wanted, first);
  std::lock_guard lock(mu_);
  if (held_.Settle(wanted, scan, std::chrono::steady_clock::now(), &account_, log_) > 0) {
    ResumeCachesLocked();
  }
}

void Store::ResumeCachesLocked() {
  for (auto& [id, c] : caches_) c->ResumeIfCapAllows(account_);
}

Status Store::CheckSession(uint32_t id) {
  std::lock_guard lock(mu_);
  return sessions_.count(id) ? Status::OK() : NoSession(id);
}

Status Store::OpenCache(uint32_t session_id, const std::string& name,
                        const std::string& fingerprint, uint64_t size_mb,
                        bool spilling, uint32_t* cache_id) {
  std::lock_guard lock(mu_);
  auto sit = sessions_.find(session_id);
  if (sit == sessions_.end()) return NoSession(session_id);
  Status s = CheckCacheName(name, fingerprint);
  if (!s.ok()) return s;
  if (spilling && options_.spill_dir.empty()) {
    return Status::InvalidArgument(
        "spilling was requested but the cache server has no spill directory; "
        "restart it with 'shmcache --start -s DIR'");
  }
  for (uint32_t cid : sit->second) {
    CacheState* c = caches_.at(cid).get();
    if (c->name() != name) continue;
    if (c->fingerprint() != fingerprint) {
      return Status::FingerprintMismatch(fmt::format(
          "cache '{}' in session {} holds rows of another pipeline (fingerprint "
          "'{}', this one is '{}'); use another cache name or session",
          name, session_id, c->fingerprint(), fingerprint));
    }
    *cache_id = cid;
    return Status::OK();
  }
  if (size_mb > (account_.cap >> 20)) {
    return Status::InvalidArgument(fmt::format(
        "cache size {} MB is more than the server's memory cap of {} MB",
        size_mb, account_.cap >> 20));
  }
  uint64_t budget = size_mb ? size_mb << 20 : account_.cap;
  // Random ids: nobody can take the name of the next cache's header ahead
  // of it; an id whose name is taken anyway is skipped.
  uint32_t id = 0;
  std::unique_ptr<CacheState> c;
  for (int attempt = 0; attempt < kCacheIdTries; ++attempt) {
    do {
      id = rng_();
    } while (id == 0 || caches_.count(id) != 0);
    s = CacheState::Create(paths_, id, session_id, name, fingerprint, budget,
                           spilling, num_nodes_, &account_, log_, &c);
    if (!s.IsAlreadyExists()) break;
    log_->Warn("cache id {} skipped: {}", id, s.message());
  }
  if (!s.ok()) return s;
  caches_[id] = std::move(c);
  sit->second.push_back(id);
  log_->Info("cache {} '{}' opened in session {} ({} MB{})", id, name,
             session_id, size_mb, spilling ? ", spilling" : "");
  *cache_id = id;
  return Status::OK();
}

Status Store::CacheFor(uint32_t cache_id, CacheState** out) {
  auto it = caches_.find(cache_id);
  if (it == caches_.end()) {
    return Status::NotFound(fmt::format("cache {} does not exist", cache_id));
  }
  *out = it->second.get();
  return Status::OK();
}

void Store::CheckHighWater() {
  bool high = account_.used > account_.cap / 100 * 85;
  if (high && !warned_high_water_) {
    log_->Warn("shared memory in use ({} MB) passed 85% of the cap ({} MB)",
               account_.used >> 20, account_.cap >> 20);
  }
  warned_high_water_ = high;
}

Status Store::LeaseChunk(uint64_t conn, uint32_t cache_id, int node,
                         uint64_t need, ChunkLease* out) {
  std::unique_lock lock(mu_);
  CacheState* c;
  Status s;
  for (;;) {
    // Looked up again after each wait: the cache may have been destroyed.
    s = CacheFor(cache_id, &c);
    if (!s.ok()) return s;
    bool wait = false;
    s = c->Lease(conn, node, need, &account_, out, stopping_ ? nullptr : &wait);
    if (!wait) break;
    job_done_cv_.wait(lock);
  }
  if (s.ok()) {
    int n = (node % num_nodes_ + num_nodes_) % num_nodes_;
    if (std::optional<SegmentJob> job = c->TakeSegmentJob(n, &account_)) {
      jobs_.push_back(*job);
      jobs_cv_.notify_one();
    }
  }
  CheckHighWater();
  return s;
}

Status Store::ReturnChunk(uint64_t conn, uint32_t cache_id, uint32_t seg_no,
                          uint64_t offset) {
  std::lock_guard lock(mu_);
  CacheState* c;
  Status s = CacheFor(cache_id, &c);
  if (s.ok()) c->Return(conn, seg_no, offset);
  return s;
}

Status Store::GrowIndex(uint32_t cache_id, uint32_t seen) {
  std::lock_guard lock(mu_);
  CacheState* c;
  Status s = CacheFor(cache_id, &c);
  if (!s.ok()) return s;
  s = c->GrowIndex(seen, &account_);
  CheckHighWater();
  return s;
}

void Store::ReleaseConnection(uint64_t conn, int pid) {
  std::lock_guard lock(mu_);
  if (ProcessGone(pid)) {
    for (auto& [id, c] : caches_) c->ReleaseConnection(conn, true);
    return;
  }
  // Either the process is in the middle of exiting, or its connection broke
  // while it lives on and may still write into its chunks.
  pending_releases_.push_back(
      {conn, pid, std::chrono::steady_clock::now() + kReleaseGrace});
  jobs_cv_.notify_one();
}

void Store::RetryReleasesLocked() {
  auto now = std::chrono::steady_clock::now();
  std::erase_if(pending_releases_, [&](const PendingRelease& p) {
    bool gone = ProcessGone(p.pid);
    if (!gone && now < p.deadline) return false;
    if (!gone) WarnChunksStayLocked(p.pid);
    for (auto& [id, c] : caches_) c->ReleaseConnection(p.conn, gone);
    return true;
  });
}

void Store::WarnChunksStayLocked(int pid) {
  // A process that opens and drops caches by the thousand must not flood
  // the log: one line per process.
  if (warned_pids_.count(pid)) return;
  if (warned_pids_.size() >= kMaxWarnedPids) {
    std::erase_if(warned_pids_, [](int p) { return ProcessGone(p); });
    if (warned_pids_.size() >= kMaxWarnedPids) warned_pids_.clear();
  }
  warned_pids_.insert(pid);
  log_->Warn("connections of process {} ended while it runs on; the chunks "
             "they leased stay with it (said once per process)",
             pid);
}

Status Store::SpillPut(uint32_t cache_id, uint64_t row_id,
                       std::span<const std::byte> row, bool* inserted) {
  *inserted = false;
  std::lock_guard lock(mu_);
  CacheState* c;
  Status s = CacheFor(cache_id, &c);
  if (!s.ok()) return s;
  if (!spill_ || !c->spilling()) {
    return Status::Full(fmt::format("cache {} is full and does not spill", cache_id));
  }
  s = spill_->Put(cache_id, row_id, row);
  if (!s.ok()) {
    log_->Error("cache {}: spilling stopped: {}", cache_id, s.message());
    c->StopSpilling(s.message());
    return Status::Full(fmt::format("cache {} stopped spilling: {}", cache_id, s.message()));
  }
  return c->PublishSpilled(row_id, row.size(), &account_, inserted);
}

Status Store::SpillGet(uint32_t cache_id, std::span<const uint64_t> ids,
                       std::vector<std::string>* rows, std::vector<bool>* found) {
  {
    std::lock_guard lock(mu_);
    CacheState* c;
    Status s = CacheFor(cache_id, &c);
    if (!s.ok()) return s;
    if (!spill_) return Status::NotFound("this server does not spill");
  }
  // RocksDB is thread-safe; reads need not hold the store's lock. A cache
  // destroyed meanwhile yields misses.
  Status s = spill_->MultiGet(cache_id, ids, rows, found);
  if (s.ok()) CountSpillReads(cache_id, std::count(found->begin(), found->end(), true));
  return s;
}

void Store::CountSpillReads(uint32_t cache_id, uint64_t n) {
  std::lock_guard lock(mu_);
  CacheState* c;
  if (n > 0 && CacheFor(cache_id, &c).ok()) c->CountSpillReads(n);
}

void Store::Note(const std::string& text) {
  log_->Warn("{}", text);
  notes_.push_back(text);
}

void Store::ReconcileSpill(const std::string& recorded) {
  const std::string current = spill_ ? spill_->path() : "";
  // No record: nothing spilled yet, or an index from a server before the
  // record; its rows are served where they are found, as they were then.
  const bool same_db = spill_ && (recorded.empty() || SameSpillDb(recorded, current));
  std::set<uint32_t> on_disk;
  if (spill_) {
    for (uint32_t id : spill_->CacheIds()) on_disk.insert(id);
  }
  for (auto& [id, c] : caches_) {
    std::string why;  // why its spilled rows cannot be read here
    if (!spill_) {
      why = "this server has no spill directory";
    } else if (!same_db) {
      why = fmt::format("this server spills to {}, not {}", current, recorded);
    } else if (on_disk.count(id) == 0) {
      why = fmt::format("{} holds none of them", current);
    }
    ReconcileCacheSpill(id, c.get(), why, on_disk.count(id) != 0);
  }
  if (!recorded.empty() && !SameSpillDb(recorded, current)) {
    RemoveEarlierSpillDb(recorded);
  }
  Status s = WriteSpillRecord(paths_, current);
  if (!s.ok()) log_->Error("{}", s.message());
}

void Store::ReconcileCacheSpill(uint32_t id, CacheState* c, const std::string& why,
                                bool on_disk) {
  std::vector<std::string> told;
  if (!why.empty()) {
    if (uint64_t n = c->DropSpilledRows()) {
      told.push_back(fmt::format("{} spilled rows were dropped ({}); they read as "
                                 "misses{}",
                                 n, why, spill_ ? " and are cached again when put" : ""));
    }
    // Rows on disk the index no longer points to.
    if (on_disk) spill_->DropCache(id).PermitUncheckedError();
  }
  if (!spill_ && c->spill_enabled()) {
    c->StopSpilling("this server has no spill directory");
    told.push_back(fmt::format("it no longer spills{} (start the server with -s DIR "
                               "to spill)",
                               c->Stats().full ? " and is full" : ""));
  }
  if (told.empty()) return;
  std::string text = c->Label() + ": " + told[0];
  for (size_t i = 1; i < told.size(); ++i) text += "; " + told[i];
  Note(text);
}

void Store::RemoveEarlierSpillDb(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  if (!IsSpillDbOf(path, paths_.port)) {
    Note(fmt::format("left {} in place: it is not named as a spill database of "
                     "this server", path));
    return;
  }
  // Opening it first takes its lock: a database another process uses is
  // never removed.
  std::unique_ptr<SpillStore> old;
  Status s = SpillStore::Open(path, &old, /*create=*/false);
  bool had_rows = s.ok() && !old->CacheIds().empty();
  if (s.ok()) s = old->DestroyAll();
  if (!s.ok()) {
    Note(fmt::format("cannot remove {}, the earlier server's spill database: {}; "
                     "remove it once no server uses it", path, s.message()));
  } else if (had_rows) {
    Note(fmt::format("removed {}, the earlier server's spill database", path));
  } else {
    log_->Info("removed {}, the earlier server's spill database (empty)", path);
  }
}

void Store::ListSessions(std::vector<SessionInfo>* out) {
  std::lock_guard lock(mu_);
  out->clear();
  for (const auto& [sid, cids] : sessions_) {
    SessionInfo info;
    info.session_id = sid;
    for (uint32_t cid : cids) info.caches.push_back(caches_.at(cid)->Stats());
    out->push_back(std::move(info));
  }
}

void Store::FillServerInfo(ServerInfo* out) {
  std::lock_guard lock(mu_);
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
  out->numa_nodes = num_nodes_;
  out->sessions.clear();
  for (const auto& [sid, cids] : sessions_) out->sessions.push_back(sid);
  out->connections = static_cast<uint64_t>(std::max<int64_t>(0, connections_.load()));
  out->start_time_unix = started_unix_;
  out->uptime_seconds = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - started_).count();
}

void Store::Shutdown() {
  StopPreparer();
  std::lock_guard lock(mu_);
  for (auto& [id, c] : caches_) c->Destroy(&account_);
  caches_.clear();
  sessions_.clear();
  ShmFile::Unlink(paths_.SessionsFile()).PermitUncheckedError();
  WriteSpillRecord(paths_, "").PermitUncheckedError();
  if (spill_) {
    Status s = spill_->DestroyAll();
    if (!s.ok()) log_->Warn("{}", s.message());
    spill_.reset();
  }
}

}  // namespace shmcache
