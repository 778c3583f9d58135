// The segment preparer: one thread that creates (allocates and clears)
// the segments caches will lease next, off the connections' threads, and
// between jobs retries connection releases and settles held memory.

#include "daemon/store.h"

namespace shmcache {

void Store::StopPreparer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  jobs_cv_.SignalAll();
  job_done_cv_.SignalAll();
  if (preparer_.joinable()) preparer_.join();
}

void Store::PrepareSegments() {
  // Locked and unlocked by hand: the lock is let go around each job and
  // each scan of held memory.
  mu_.Lock();
  for (;;) {
    auto ready = [&]() REQUIRES(mu_) { return stopping_ || !jobs_.empty(); };
    auto polling = [&]() REQUIRES(mu_) {
      return !pending_releases_.empty() || !held_.empty();
    };
    if (!polling()) {
      while (!ready() && !polling()) jobs_cv_.Wait(&mu_);
    } else {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      while (!ready() && jobs_cv_.WaitUntil(&mu_, deadline)) {
      }
      RetryReleasesLocked();
      if (held_.ScanDue(std::chrono::steady_clock::now())) {
        mu_.Unlock();
        SettleHeldMemory();
        mu_.Lock();
      }
    }
    if (stopping_) break;
    if (jobs_.empty()) continue;
    SegmentJob job = jobs_.front();
    jobs_.pop_front();
    running_job_cache_ = job.cache_id;
    mu_.Unlock();
    ShmFile file;
    Status made = SegmentAllocator::CreateSegmentFile(paths_, job.cache_id, job.seg_no,
                                                      job.node, job.size, &file);
    mu_.Lock();
    running_job_cache_ = 0;
    auto it = caches_.find(job.cache_id);
    if (it == caches_.end()) {  // destroyed meanwhile; its memory was released
      file.Unmap();
      ShmFile::Unlink(paths_.SegmentFile(job.cache_id, job.seg_no))
          .PermitUncheckedError();
      job_done_cv_.SignalAll();
      continue;
    }
    it->second->FinishSegmentJob(job, made, std::move(file), &account_);
    job_done_cv_.SignalAll();
  }
  mu_.Unlock();
}

}  // namespace shmcache
