// Chunks leased to writers, returned, and index growth; the 85% high-water
// warning on shared memory.

#include "store.h"

#include "logger.h"

namespace shmcache {

void Store::CheckHighWater() {
  bool high = account_.used > account_.cap / 100 * 85;
  if (high && !warned_high_water_) {
    log_->Warn("shared memory in use ({} MB) passed 85% of the cap ({} MB)",
               account_.used >> 20, account_.cap >> 20);
  }
  warned_high_water_ = high;
}

Status Store::LeaseChunk(uint64_t conn, uint32_t cache_id, int node, uint64_t need,
                         ChunkLease* out) {
  MutexLock lock(&mu_);
  CacheState* c;
  Status s;
  for (;;) {
    // Looked up again after each wait: the cache may have been destroyed.
    s = CacheFor(cache_id, &c);
    if (!s.ok()) return s;
    bool wait = false;
    s = c->Lease(conn, node, need, &account_, out, stopping_ ? nullptr : &wait);
    if (!wait) break;
    job_done_cv_.Wait(&mu_);
  }
  if (s.ok()) {
    int n = (node % num_nodes_ + num_nodes_) % num_nodes_;
    if (std::optional<SegmentJob> job = c->TakeSegmentJob(n, &account_)) {
      jobs_.push_back(*job);
      jobs_cv_.Signal();
    }
  }
  CheckHighWater();
  return s;
}

Status Store::ReturnChunk(uint64_t conn, uint32_t cache_id, uint32_t seg_no,
                          uint64_t offset) {
  MutexLock lock(&mu_);
  CacheState* c;
  Status s = CacheFor(cache_id, &c);
  if (s.ok()) c->Return(conn, seg_no, offset);
  return s;
}

Status Store::GrowIndex(uint32_t cache_id, uint32_t seen) {
  MutexLock lock(&mu_);
  CacheState* c;
  Status s = CacheFor(cache_id, &c);
  if (!s.ok()) return s;
  s = c->GrowIndex(seen, &account_);
  CheckHighWater();
  return s;
}

}  // namespace shmcache
