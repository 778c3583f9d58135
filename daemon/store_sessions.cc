// The registry: sessions, the caches in them, and the memory dropped
// sessions leave held while readers still map it.

#include "daemon/store.h"

#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "daemon/logger.h"
#include "daemon/replace_file.h"
#include "format/cache_name.h"
#include "format/instance.h"

namespace shmcache {

Status Store::WriteSessionsFile() {
  // A plain file beside the segments: lists live sessions for a restarted
  // daemon and for people looking at /dev/shm; 0600, the only mode the next
  // server reads.
  std::string text;
  for (const auto& [id, caches] : sessions_) text += fmt::format("{}\n", id);
  Status s = ReplaceFile(paths_.SessionsFile(), text, 0600);
  if (!s.ok()) log_->Error("the list of sessions is not written: {}", s.message());
  return s;
}

Status Store::ClaimFileNames() {
  // Adoption read (or ignored) what was there. A rename cannot replace a
  // directory, and a list must not go through someone else's file.
  for (const auto& [path, what] :
       {std::pair{paths_.SessionsFile(), "the list of sessions"},
        std::pair{paths_.SpillRecordFile(), "the spill record"}}) {
    std::string removed;
    Status s = ClaimFileName(path, what, &removed);
    if (!s.ok()) return s;
    if (!removed.empty()) {
      log_->Warn("removed {}, {}: it was not {} of this server", path, removed, what);
    }
  }
  return Status::OK();
}

Status Store::CreateSession(uint32_t* id) {
  MutexLock lock(&mu_);
  if (sessions_.size() >= layout::kMaxSessions) {
    return Status::Full(fmt::format(
        "too many sessions; destroy some with 'shmcache -d ID{}'", PortArg(paths_.port)));
  }
  uint32_t s;
  do {
    s = rng_();
  } while (s == 0 || sessions_.count(s) != 0);
  sessions_[s] = {};
  if (Status w = WriteSessionsFile(); !w.ok()) {
    sessions_.erase(s);
    return Status::IOError(fmt::format(
        "no session was created: it would not survive a restart of the server, whose "
        "list of sessions cannot be written ({})",
        w.message()));
  }
  log_->Info("session {} created", s);
  *id = s;
  return Status::OK();
}

// The commands it suggests name the port of a server not on the default
// one: without -p they would ask another server, or none.
static Status NoSession(uint32_t id, int port) {
  const std::string p = PortArg(port);
  return Status::NotFound(fmt::format(
      "session {} does not exist; list them with 'shmcache --list_sessions{}' or "
      "create one with 'shmcache -g{}'",
      id, p, p));
}

Status Store::DestroySession(uint32_t id) {
  Status written;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return NoSession(id, paths_.port);
    // No segment of the session may appear after destroy returns: let a
    // running job for one of its caches finish first (holding the lock from
    // then on, no other starts), and drop the queued ones. Nor a spilled row:
    // staged writes of its caches finish first too.
    const std::vector<uint32_t> cids = it->second;
    auto ours = [&](uint32_t cid) {
      return std::find(cids.begin(), cids.end(), cid) != cids.end();
    };
    while (std::any_of(running_jobs_.begin(), running_jobs_.end(), ours) ||
           std::any_of(spill_writes_.begin(), spill_writes_.end(), ours)) {
      job_done_cv_.Wait(&mu_);
    }
    std::erase_if(jobs_, [&](const SegmentJob& j) { return ours(j.cache_id); });
    // A lease waiting for one of the dropped jobs is woken by none finishing:
    // wake it now, to find its cache gone (CacheFor) instead of sleeping until
    // some other cache's job ends, which on an idle server is never.
    job_done_cv_.SignalAll();
    it = sessions_.find(id);
    if (it == sessions_.end()) return NoSession(id, paths_.port);  // destroyed meanwhile
    std::vector<HeldFile> held;
    for (uint32_t cid : it->second) {
      auto c = caches_.find(cid);
      if (c == caches_.end()) continue;
      c->second->Destroy(&account_, &held);
      caches_.erase(c);
      stages_.ReleaseCache(cid);
      Status s = spiller_.DropCache(cid);
      if (!s.ok()) log_->Warn("cache {}: cannot drop spilled rows: {}", cid, s.message());
    }
    sessions_.erase(it);
    written = WriteSessionsFile();
    log_->Info("session {} destroyed", id);
    held_.Add(id, held, std::chrono::steady_clock::now());
    ResumeCachesLocked();
  }
  // The first preparer re-checks what stays held, and scans for readers
  // that still map it: not this request, as a scan of every process's maps
  // takes seconds on a busy host, and the client's request would time out.
  jobs_cv_.SignalAll();
  if (!written.ok()) {
    return Status::IOError(fmt::format(
        "session {} was destroyed, but the list of sessions cannot be rewritten ({}): "
        "a restarted server would list it again, empty",
        id, written.message()));
  }
  return Status::OK();
}

void Store::SettleHeldMemory() {
  std::vector<FileId> wanted;
  std::vector<int> first;
  {
    MutexLock lock(&mu_);
    if (held_.empty()) return;
    wanted = held_.Wanted();
    first = held_.holders();
  }
  MappedScan scan = FindMappedDeleted(wanted, first);
  MutexLock lock(&mu_);
  if (held_.Settle(wanted, scan, std::chrono::steady_clock::now(), &account_, log_) > 0) {
    ResumeCachesLocked();
  }
}

void Store::ResumeCachesLocked() {
  for (auto& [id, c] : caches_) c->ResumeIfCapAllows(account_);
}

Status Store::CheckSession(uint32_t id) {
  MutexLock lock(&mu_);
  if (sessions_.count(id) == 0) return NoSession(id, paths_.port);
  return Status::OK();
}

// A size over the cap gets the cap: the cache holds what can be had and the
// client, which sees the cap and its bound in the server info, says so once
// at open (rows beyond it are read from the source).
uint64_t Store::BudgetFor(uint64_t size_mb) const {
  return size_mb ? std::min<uint64_t>(size_mb << 20, account_.cap) : account_.cap;
}

Status Store::OpenCache(uint32_t session_id, const std::string& name,
                        const std::string& fingerprint, uint64_t size_mb,
                        bool spill_requested, uint32_t* cache_id) {
  if (size_mb > kMaxCacheSizeMb) {
    return Status::InvalidArgument(fmt::format(
        "cache size {} MB is out of range: at most {} MB (the size is in MB, not bytes; "
        "0 asks for as much as the server allows)",
        size_mb, kMaxCacheSizeMb));
  }
  MutexLock lock(&mu_);
  auto sit = sessions_.find(session_id);
  if (sit == sessions_.end()) return NoSession(session_id, paths_.port);
  Status s = CheckCacheName(name, fingerprint);
  if (!s.ok()) return s;
  if (spill_requested && options_.spill_dir.empty()) {
    const std::string p = PortArg(paths_.port);
    return Status::InvalidArgument(fmt::format(
        "spilling was requested but the cache server has no spill directory; "
        "restart it with one: 'shmcache --stop{}', then 'shmcache --start{} -s DIR'",
        p, p));
  }
  for (uint32_t cid : sit->second) {
    CacheState* c = caches_.at(cid).get();
    if (c->name() != name) continue;
    if (c->fingerprint() != fingerprint) {
      return Status::FingerprintMismatch(fmt::format(
          "cache '{}' in session {} holds rows of a different pipeline (fingerprint "
          "'{}', this one is '{}'); use another cache name or session",
          name, session_id, c->fingerprint(), fingerprint));
    }
    // "Open the cache with a larger size_mb" is what a full cache's
    // warning tells its user: the next run's open raises the budget. 0
    // asks for nothing (a reader, a tool): the cache keeps what it has.
    if (size_mb != 0) c->RaiseBudget(BudgetFor(size_mb));
    // The other fix it tells: spilling=True (the server has a spill dir).
    if (spill_requested) c->RequestSpilling();
    *cache_id = cid;
    return Status::OK();
  }
  const uint64_t budget = BudgetFor(size_mb);
  // Random ids: nobody can take the name of the next cache's header ahead
  // of it; an id whose name is taken anyway is skipped.
  uint32_t id = 0;
  std::unique_ptr<CacheState> c;
  for (int attempt = 0; attempt < kCacheIdTries; ++attempt) {
    do {
      id = rng_();
    } while (id == 0 || caches_.count(id) != 0);
    s = CacheState::Create(paths_, id, session_id, name, fingerprint, budget,
                           spill_requested, num_nodes_, &account_, log_, &c, [this] {
                             mu_.AssertHeld();  // called back under this scope's lock
                             AtLockedStep(LockedStep::kTableInstalling);
                           });
    if (!s.IsAlreadyExists()) break;
    log_->Warn("cache id {} skipped: {}", id, s.message());
  }
  if (!s.ok()) return s;
  caches_[id] = std::move(c);
  sit->second.push_back(id);
  log_->Info("cache {} '{}' opened in session {} ({} MB{})", id, name, session_id,
             size_mb, spill_requested ? ", spilling" : "");
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

void Store::ListSessions(std::vector<SessionInfo>* out) {
  MutexLock lock(&mu_);
  out->clear();
  for (const auto& [sid, cids] : sessions_) {
    SessionInfo info;
    info.session_id = sid;
    for (uint32_t cid : cids) info.caches.push_back(caches_.at(cid)->Stats());
    out->push_back(std::move(info));
  }
}

}  // namespace shmcache
