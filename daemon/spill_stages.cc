#include "daemon/spill_stages.h"

#include <algorithm>
#include <array>

#include "format/align.h"
#include "format/protocol.h"

namespace shmcache {

SpillStages::SpillStages(const InstancePaths& paths)
    : paths_(paths), rng_(std::random_device{}()) {}

SpillStages::~SpillStages() { ReleaseAll(); }

Status SpillStages::Get(uint64_t conn, uint32_t cache_id, uint64_t min_bytes,
                        uint32_t* tag, uint64_t* size) {
  MutexLock lock(&mu_);
  auto key = std::make_pair(conn, cache_id);
  auto it = stages_.find(key);
  if (it != stages_.end() && it->second->file.size() >= min_bytes) {
    *tag = it->second->tag;
    *size = it->second->file.size();
    return Status::OK();
  }
  if (it != stages_.end()) {
    Drop(cache_id, *it->second);
    stages_.erase(it);
  }
  const uint64_t want = AlignUp(std::max(protocol::kSpillStageBytes, min_bytes), 4096);
  auto stage = std::make_shared<Stage>();
  // A random tag, as index tables have: a name another user planted is
  // skipped, not trusted.
  uint32_t chosen = 0;
  std::array<uint32_t, kTagTries> tags;
  for (uint32_t& t : tags) t = static_cast<uint32_t>(rng_());
  Status s = ShmFile::CreateFresh(
      [&](uint32_t i) { return paths_.StageFile(cache_id, tags[i]); }, kTagTries, want,
      /*node=*/-1, &stage->file, &chosen);
  if (!s.ok()) return s;
  stage->tag = tags[chosen];
  *tag = stage->tag;
  *size = stage->file.size();
  stages_[key] = std::move(stage);
  return Status::OK();
}

std::shared_ptr<const SpillStages::Stage> SpillStages::Find(uint64_t conn,
                                                            uint32_t cache_id,
                                                            uint32_t tag) {
  MutexLock lock(&mu_);
  auto it = stages_.find(std::make_pair(conn, cache_id));
  if (it == stages_.end() || it->second->tag != tag) return nullptr;
  return it->second;
}

void SpillStages::Drop(uint32_t cache_id, const Stage& stage) {
  // Unlinked now; unmapped when the last request using it lets go.
  ShmFile::Unlink(paths_.StageFile(cache_id, stage.tag)).PermitUncheckedError();
}

void SpillStages::Release(uint64_t conn) {
  MutexLock lock(&mu_);
  for (auto it = stages_.lower_bound(std::make_pair(conn, uint32_t{0}));
       it != stages_.end() && it->first.first == conn;) {
    Drop(it->first.second, *it->second);
    it = stages_.erase(it);
  }
}

void SpillStages::ReleaseCache(uint32_t cache_id) {
  MutexLock lock(&mu_);
  std::erase_if(stages_, [&](const auto& entry) REQUIRES(mu_) {
    if (entry.first.second != cache_id) return false;
    Drop(cache_id, *entry.second);
    return true;
  });
}

void SpillStages::ReleaseAll() {
  MutexLock lock(&mu_);
  for (const auto& [key, stage] : stages_) Drop(key.second, *stage);
  stages_.clear();
}

}  // namespace shmcache
