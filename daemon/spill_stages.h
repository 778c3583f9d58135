// SpillStages: the staging files of spilled puts (protocol.h, kSpillStage),
// one per connection and cache. A client encodes spilled rows into its
// stage and sends only their ids and sizes; the daemon copies them out of
// the stage into one RocksDB write batch (CacheSpiller::PutStaged). Only the
// daemon makes, sizes and removes these files, as every shm file.
//
// A stage lives as long as its connection and its cache: Release (the
// connection ended), ReleaseCache (the cache was destroyed) and ReleaseAll
// (the server stops) unlink its file. A stage in use by a
// request stays mapped until that request lets go of it (shared_ptr), even
// when its connection ends meanwhile. A restarted server removes the stages
// of the earlier one (daemon/adoption.cc). Stages are not counted against
// the memory cap: they are bounded by the connections that spill, at
// protocol::kSpillStageBytes each (more only for a row that needs it, up
// to protocol::kMaxSpilledRowBytes).
//
// Thread safety: every method may be called from any thread (own mutex).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <utility>

#include "format/instance.h"
#include "format/shm_file.h"
#include "port/mutex.h"
#include "shmcache/status.h"

namespace shmcache {

class SpillStages {
 public:
  struct Stage {
    uint32_t tag = 0;
    ShmFile file;  // unlinked already when its connection ended
  };

  explicit SpillStages(const InstancePaths& paths);
  ~SpillStages();

  // The stage of (conn, cache_id), of at least min_bytes: the one it has,
  // or a new one (the old one removed) of max(kSpillStageBytes, min_bytes)
  // rounded up to whole pages. FullNoShmRoom (or another error of
  // ShmFile::Create) when it cannot be made.
  Status Get(uint64_t conn, uint32_t cache_id, uint64_t min_bytes, uint32_t* tag,
             uint64_t* size) EXCLUDES(mu_);
  // The stage of (conn, cache_id) named `tag`; null when there is none (the
  // client asks for one again).
  std::shared_ptr<const Stage> Find(uint64_t conn, uint32_t cache_id, uint32_t tag)
      EXCLUDES(mu_);
  // Removes the stages of a connection that ended.
  void Release(uint64_t conn) EXCLUDES(mu_);
  // Removes every connection's stage of a cache that was destroyed.
  void ReleaseCache(uint32_t cache_id) EXCLUDES(mu_);
  // Removes every stage (the server stops).
  void ReleaseAll() EXCLUDES(mu_);

 private:
  void Drop(uint32_t cache_id, const Stage& stage) REQUIRES(mu_);
  static constexpr uint32_t kTagTries = 8;

  InstancePaths paths_;
  Mutex mu_;
  std::mt19937 rng_ GUARDED_BY(mu_);
  // (conn, cache id) -> its stage.
  std::map<std::pair<uint64_t, uint32_t>, std::shared_ptr<Stage>> stages_ GUARDED_BY(mu_);
};

}  // namespace shmcache
