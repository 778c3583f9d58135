// Room for rows: chunks leased to writers, returned, index growth, and rows
// spilled to disk (CacheSpiller); the 85% high-water warning on shared
// memory.

#include "daemon/store.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include <fmt/format.h>

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
    // The pages the next leases need (and, when it waits, this one: on
    // another node's segment, once the budget is used up).
    const int n = (node % num_nodes_ + num_nodes_) % num_nodes_;
    std::vector<SegmentJob> jobs = c->TakeSupplyJobs(n);
    for (int other = 0; wait && other < num_nodes_; ++other) {
      if (other == n) continue;
      std::vector<SegmentJob> more = c->TakeSupplyJobs(other);
      jobs.insert(jobs.end(), more.begin(), more.end());
    }
    if (s.ok() && !wait) {
      std::vector<SegmentJob> more = c->TakeSegmentJobs(n, &account_, preparer_threads_);
      jobs.insert(jobs.end(), more.begin(), more.end());
    }
    jobs_.insert(jobs_.end(), jobs.begin(), jobs.end());
    if (jobs.size() == 1) jobs_cv_.Signal();
    if (jobs.size() > 1) jobs_cv_.SignalAll();
    if (!wait) break;
    job_done_cv_.Wait(&mu_);
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
  GrowthRun run{.cache_id = cache_id};
  // Another growth of this cache is under way: the writers that met the
  // same full table wait for it, then find the table added.
  Status s = CacheNotGrowing(cache_id, &run.cache);
  bool needed = false;
  if (s.ok()) s = run.cache->BeginGrowth(seen, &account_, &run.g, &needed);
  if (needed) {
    // From here the growth holds its cache (growing(), running_jobs_)
    // until EndGrowthLocked, and a handler that throws is logged and
    // served on (RunWorker): a step let throw past here would keep every
    // later growth of the cache, its destroy and the daemon's stop waiting
    // for good. Caught instead, and the growth ended first (nothing that
    // may throw again comes before it), as a failed one.
    std::exception_ptr thrown;
    bool added = false;  // thrown once FinishGrowth settled the table
    try {
      s = GrowInSteps(&run);
    } catch (...) {
      thrown = std::current_exception();
      added = run.g.finished;
    }
    EndGrowthLocked(&run);
    if (thrown) {
      const std::string what = WhatThrew(thrown);
      log_->Error("cache {}: a step of the index's growth threw: {}", cache_id, what);
      // Thrown once the table was added: the growth is done all the same.
      s = added
              ? run.finished
              : Status::IOError(fmt::format("cannot make index table {} of cache {}: {}",
                                            run.g.gen, cache_id, what));
    }
  }
  CheckHighWater();
  return s;
}

Status Store::GrowInSteps(GrowthRun* run) {
  // The lock is let go (MutexUnlock) while the new table is made (its
  // file's pages allocated, cleared and mapped: two thirds of the growth's
  // CPU past 1 Mi rows) and while the older tables' slots are freed. Every
  // request that takes the lock (leases, opens, other caches' growths)
  // waits only for the publish and the copy.
  AtLockedStep(LockedStep::kGrowthBegun);
  // The cache stays (DestroySession waits for its running jobs) and no
  // other growth of it starts (growing()) until EndGrowth.
  running_jobs_.insert(run->cache_id);
  run->registered = true;
  Status made;
  {
    MutexUnlock unlocked(&mu_);
    std::string skipped;
    made = CacheState::MakeTable(paths_, run->cache_id, run->g, &run->file, &run->tag,
                                 &skipped);
    run->made = made.ok();
    if (!skipped.empty()) log_->Warn("cache {}: skipped {}", run->cache_id, skipped);
    if (test_hooks_.table_made) test_hooks_.table_made();
  }
  AtLockedStep(LockedStep::kGrowthFinishing);
  run->finished =
      run->cache->FinishGrowth(&run->g, made, std::move(run->file), run->tag, &account_);
  AtLockedStep(LockedStep::kGrowthFinished);
  if (!run->g.to_free.empty()) {
    MutexUnlock unlocked(&mu_);
    CacheState::FreeCompacted(&run->g);
    run->g.to_free.clear();  // freed: nothing is left for EndGrowthLocked
  }
  AtLockedStep(LockedStep::kGrowthEnding);
  return run->finished;
}

void Store::EndGrowthLocked(GrowthRun* run) {
  CacheState::Growth& g = run->g;
  if (!g.finished) {
    // Thrown before FinishGrowth settled the table: its file (made, or
    // created before MakeTable threw) is removed, as a failed growth's.
    const bool created = run->made || run->file.data() != nullptr;
    run->file.Unmap();
    if (created) {
      ShmFile::Unlink(paths_.TableFile(run->cache_id, g.gen, run->tag))
          .PermitUncheckedError();
    }
    run->cache
        ->FinishGrowth(&g, Status::IOError("a step of the growth threw"), ShmFile(), 0,
                       &account_)
        .PermitUncheckedError();
  }
  // Thrown between FinishGrowth and the free: freed here, under the lock.
  if (!g.to_free.empty()) CacheState::FreeCompacted(&g);
  if (!g.ended) run->cache->EndGrowth(&g, &account_);
  if (run->registered) {
    running_jobs_.erase(running_jobs_.find(run->cache_id));
    run->registered = false;
  }
  job_done_cv_.SignalAll();
  // Between the steps the cap's room was short by the older tables' bytes
  // (held until freed) besides the new table's: a lease or growth of any
  // cache that came then may have found the cap used up and marked its
  // cache full by it. Those bytes are back: such caches take rows again,
  // as when a destroy frees memory.
  if (g.freed > 0) ResumeCachesLocked();
}

Status Store::CacheNotGrowing(uint32_t cache_id, CacheState** out) {
  for (;;) {
    // Looked up again after each wait: the cache may have been destroyed.
    Status s = CacheFor(cache_id, out);
    if (!s.ok() || !(*out)->growing()) return s;
    job_done_cv_.Wait(&mu_);
  }
}

Status Store::SpillPut(uint32_t cache_id, uint64_t row_id, std::span<const std::byte> row,
                       bool* inserted) {
  *inserted = false;
  MutexLock lock(&mu_);
  CacheState* c;
  // Its publish may grow the index (under the lock): not inside a growth
  // in steps, whose table is the one it needs (CacheNotGrowing).
  Status s = CacheNotGrowing(cache_id, &c);
  if (!s.ok()) return s;
  return spiller_.Put(cache_id, c, row_id, row, &account_, inserted);
}

Status Store::SpillGet(uint32_t cache_id, std::span<const uint64_t> ids,
                       std::vector<std::string>* rows, std::vector<Status>* statuses) {
  {
    MutexLock lock(&mu_);
    CacheState* c;
    Status s = CacheFor(cache_id, &c);
    if (!s.ok()) return s;
    if (!spiller_.enabled()) return Status::NotFound("this server does not spill");
  }
  // RocksDB is thread-safe; reads need not hold the store's lock. A cache
  // destroyed meanwhile yields misses.
  Status s = spiller_.Get(cache_id, ids, rows, statuses);
  if (!s.ok()) return s;
  CountSpillReads(cache_id, std::count_if(statuses->begin(), statuses->end(),
                                          [](const Status& r) { return r.ok(); }));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!(*statuses)[i].ok() && !(*statuses)[i].IsNotFound()) {
      (*statuses)[i] =
          DropCorruptRow(cache_id, ids[i], (*rows)[i].size(), (*statuses)[i]);
    }
  }
  return Status::OK();
}

Status Store::DropCorruptRow(uint32_t cache_id, uint64_t row_id, uint64_t bytes,
                             const Status& why) {
  MutexLock lock(&mu_);
  CacheState* c;
  if (!CacheFor(cache_id, &c).ok()) return why;  // destroyed meanwhile
  const bool dropped = c->DropSpilledRow(row_id, bytes);
  if (dropped) {
    log_->Warn("{}: spilled row {} failed its check when read back, dropped: {}",
               c->Label(), row_id, why.ToString());
  }
  return Status::Corruption(fmt::format(
      "spilled row {} of cache {} failed its check on disk ({}); the server dropped it "
      "from the cache: it is a miss until it is put again",
      row_id, cache_id, why.ToString()));
}

Status Store::SpillingCacheFor(uint32_t cache_id, CacheState** out) {
  Status s = CacheFor(cache_id, out);
  if (!s.ok()) return s;
  if (!spiller_.enabled() || !(*out)->spilling_on()) {
    return Status::Full(fmt::format("{} is full and does not spill", (*out)->Label()));
  }
  return Status::OK();
}

Status Store::SpillStage(uint64_t conn, uint32_t cache_id, uint64_t min_bytes,
                         uint32_t* tag, uint64_t* size) {
  {
    MutexLock lock(&mu_);
    CacheState* c;
    Status s = SpillingCacheFor(cache_id, &c);
    if (!s.ok()) return s;
  }
  return stages_.Get(conn, cache_id, min_bytes, tag, size);
}

Status Store::SpillPutStaged(uint64_t conn, uint32_t cache_id, uint32_t tag,
                             std::span<const uint64_t> ids,
                             std::span<const uint32_t> sizes,
                             std::vector<uint8_t>* inserted) {
  inserted->clear();
  {
    MutexLock lock(&mu_);
    CacheState* c;
    Status s = SpillingCacheFor(cache_id, &c);
    if (!s.ok()) return s;
    spill_writes_.insert(cache_id);
  }
  // The disk write runs without the lock: leases, opens and other caches'
  // writes go on meanwhile (RocksDB is thread-safe).
  Status written;
  if (std::shared_ptr<const SpillStages::Stage> stage =
          stages_.Find(conn, cache_id, tag)) {
    written = spiller_.WriteStaged(
        cache_id,
        std::span(reinterpret_cast<const std::byte*>(stage->file.data()),
                  stage->file.size()),
        ids, sizes);
  } else {
    written = Status::NotFound(fmt::format(
        "staging file {:08x} of cache {} is not this connection's", tag, cache_id));
  }
  MutexLock lock(&mu_);
  spill_writes_.erase(spill_writes_.find(cache_id));
  job_done_cv_.SignalAll();
  CacheState* c;
  // Its publishes may grow the index, as SpillPut's.
  Status s = CacheNotGrowing(cache_id, &c);
  if (!s.ok()) return s;
  if (!written.ok()) {
    if (written.IsCorruption() || written.IsNotFound()) return written;
    log_->Error("cache {}: spilling stopped: {}", cache_id, written.message());
    c->StopSpilling(written.message());
    return Status::Full(
        fmt::format("cache {} stopped spilling: {}", cache_id, written.message()));
  }
  inserted->assign(ids.size(), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    bool added = false;
    s = c->PublishSpilled(ids[i], sizes[i], &account_, &added);
    if (!s.ok()) return s;
    (*inserted)[i] = added ? 1 : 0;
  }
  return Status::OK();
}

void Store::CountSpillReads(uint32_t cache_id, uint64_t n) {
  MutexLock lock(&mu_);
  CacheState* c;
  if (n > 0 && CacheFor(cache_id, &c).ok()) c->CountSpillReads(n);
}

}  // namespace shmcache
