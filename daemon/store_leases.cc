// Room for rows: chunks leased to writers, returned, index growth, and rows
// spilled to disk (CacheSpiller); the 85% high-water warning on shared
// memory.

#include "daemon/store.h"

#include <algorithm>

#include "daemon/logger.h"

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
    std::vector<SegmentJob> jobs = c->TakeSegmentJobs(n, &account_, preparer_threads_);
    jobs_.insert(jobs_.end(), jobs.begin(), jobs.end());
    if (jobs.size() == 1) jobs_cv_.Signal();
    if (jobs.size() > 1) jobs_cv_.SignalAll();
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

Status Store::SpillPut(uint32_t cache_id, uint64_t row_id, std::span<const std::byte> row,
                       bool* inserted) {
  *inserted = false;
  MutexLock lock(&mu_);
  CacheState* c;
  Status s = CacheFor(cache_id, &c);
  if (!s.ok()) return s;
  return spiller_.Put(cache_id, c, row_id, row, &account_, inserted);
}

Status Store::SpillGet(uint32_t cache_id, std::span<const uint64_t> ids,
                       std::vector<std::string>* rows, std::vector<bool>* found) {
  {
    MutexLock lock(&mu_);
    CacheState* c;
    Status s = CacheFor(cache_id, &c);
    if (!s.ok()) return s;
    if (!spiller_.enabled()) return Status::NotFound("this server does not spill");
  }
  // RocksDB is thread-safe; reads need not hold the store's lock. A cache
  // destroyed meanwhile yields misses.
  Status s = spiller_.Get(cache_id, ids, rows, found);
  if (s.ok()) CountSpillReads(cache_id, std::count(found->begin(), found->end(), true));
  return s;
}

void Store::CountSpillReads(uint32_t cache_id, uint64_t n) {
  MutexLock lock(&mu_);
  CacheState* c;
  if (n > 0 && CacheFor(cache_id, &c).ok()) c->CountSpillReads(n);
}

}  // namespace shmcache
