// Adoption: a starting server takes over the sessions and caches an earlier
// server on the same port left in the shm dir, and removes what it cannot use.
#include "daemon/adoption.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "common/process_state.h"
#include "daemon/cache_spiller.h"
#include "daemon/logger.h"
#include "format/cache_name.h"
#include "format/shm_file.h"

namespace shmcache {

Adoption::Adoption(const InstancePaths& paths, int num_nodes, int watch_pid,
                   CacheSpiller* spiller, Logger* log, NoteFn note)
    : paths_(paths),
      num_nodes_(num_nodes),
      watch_pid_(watch_pid),
      spiller_(spiller),
      log_(log),
      note_(std::move(note)) {}

void Adoption::DiscardCacheFiles(uint32_t cache_id, const std::vector<std::string>& files,
                                 const std::string& why) {
  note_(fmt::format("cache {} left by the earlier server was discarded: {}", cache_id,
                    why));
  for (const std::string& f : files) unlink(f.c_str());
  DropSpilledRows(cache_id);
}

void Adoption::DropSpilledRows(uint32_t cache_id) {
  Status s = spiller_->DropCache(cache_id);
  if (!s.ok()) {
    log_->Warn("cache {}: cannot drop its spilled rows: {}", cache_id, s.message());
  }
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
// opened. So are the staging files of the earlier server's connections
// (protocol.h, kSpillStage), which ended with it: what a client staged and
// never saw written is not in the index, and it puts those rows again.
std::map<uint32_t, FoundCache> ListInstanceFiles(const InstancePaths& paths,
                                                 Logger* log) {
  std::map<uint32_t, FoundCache> found;
  const std::string& dir = paths.shm_dir;
  std::string base = paths.shm_prefix.substr(dir.size() + 1);
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return found;
  std::vector<std::string> strays, stages;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, base.c_str(), base.size()) != 0) continue;
    std::string path = dir + "/" + e->d_name;
    ShmName n = ParseShmName(e->d_name + base.size());
    using Kind = ShmName::Kind;
    if (n.kind == Kind::kSessions || n.kind == Kind::kSpillRecord ||
        n.kind == Kind::kHugeDir) {
      continue;  // not a cache's; the huge dir is another server's shm dir
    }
    if (n.kind == Kind::kStage) {
      stages.push_back(path);
      continue;
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
  for (const std::string& f : stages) {
    log->Info("removing {}: staging file of a connection to the earlier server", f);
    ShmFile::Unlink(f).PermitUncheckedError();
  }
  return found;
}

// Test hook: with $SHMCACHE_TEST_HOLD_START naming a file, start-up waits
// here while that file exists, so that a test can act on a server that is
// still starting. A stop request, or the end of the process the server
// watches (--watch_pid), ends the wait.
void TEST_HoldStart(const std::atomic<bool>* stop_requested, int watch_pid, Logger* log) {
  const char* hold = std::getenv("SHMCACHE_TEST_HOLD_START");
  if (hold == nullptr || *hold == '\0' || access(hold, F_OK) != 0) return;
  log->Info("test hook SHMCACHE_TEST_HOLD_START: start-up held while {} exists", hold);
  while (access(hold, F_OK) == 0 && !(stop_requested && stop_requested->load()) &&
         !(watch_pid > 0 && ProcessGone(watch_pid))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

void Adoption::ReadSessionsFile(Adopted* out) {
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
    if (id != 0 && id <= UINT32_MAX) out->sessions[static_cast<uint32_t>(id)];
  }
  fclose(f);
}

bool Adoption::Run(const std::atomic<bool>* stop_requested, MemoryAccount* account,
                   Adopted* out) {
  std::map<uint32_t, FoundCache> found = ListInstanceFiles(paths_, log_);
  ReadSessionsFile(out);  // sessions, including those without caches
  TEST_HoldStart(stop_requested, watch_pid_, log_);
  size_t rows = 0;
  for (auto& [id, f] : found) {
    if (stop_requested && stop_requested->load()) return false;
    if (!f.header) {
      DiscardCacheFiles(id, f.files, "its header file is missing");
      continue;
    }
    std::unique_ptr<CacheState> c;
    Status s = CacheState::Adopt(paths_, id, f.segments, num_nodes_, account, log_, &c);
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
    out->sessions[c->session_id()].push_back(id);
    out->caches[id] = std::move(c);
  }
  for (uint32_t id : spiller_->CacheIds()) {
    if (out->caches.count(id) == 0) {
      note_(
          fmt::format("the spilled rows of cache {} were dropped: its memory "
                      "state is gone",
                      id));
      DropSpilledRows(id);
    }
  }
  if (!out->caches.empty() || !out->sessions.empty()) {
    log_->Info(
        "adopted {} session(s) and {} cache(s) with {} rows from an earlier "
        "server on port {}",
        out->sessions.size(), out->caches.size(), rows, paths_.port);
  }
  return !(stop_requested && stop_requested->load());
}

}  // namespace shmcache
