// The segment preparers: threads that create the segments caches will
// lease next and supply (allocate and clear) their pages a step ahead of
// need, off the connections' threads, several at once when writers need
// them faster than one thread makes them (SegmentAllocator::
// TakeSegmentJobs, TakeSupplyJobs); the first one also retries connection
// releases and settles held memory between jobs.

#include "daemon/store.h"

#include <algorithm>

namespace shmcache {

void Store::StopPreparer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  jobs_cv_.SignalAll();
  job_done_cv_.SignalAll();
  for (std::thread& t : preparers_) {
    if (t.joinable()) t.join();
  }
}

void Store::PrepareSegments(bool polls) {
  // Locked and unlocked by hand: the lock is let go around each job and
  // each scan of held memory.
  mu_.Lock();
  for (;;) {
    auto ready = [&]() REQUIRES(mu_) { return stopping_ || !jobs_.empty(); };
    auto polling = [&]() REQUIRES(mu_) {
      return polls && (!pending_releases_.empty() || !held_.empty());
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
    running_jobs_.insert(job.cache_id);
    mu_.Unlock();
    ShmFile file;
    Status made = SegmentAllocator::RunSegmentJob(paths_, job, &file);
    mu_.Lock();
    running_jobs_.erase(running_jobs_.find(job.cache_id));
    auto it = caches_.find(job.cache_id);
    if (it == caches_.end()) {  // destroyed meanwhile; its memory was released
      file.Unmap();
      // A new file is this job's to remove; a supplied one was the cache's,
      // removed with it (its id may be a new cache's by now).
      if (job.create) {
        ShmFile::Unlink(paths_.SegmentFile(job.cache_id, job.seg_no))
            .PermitUncheckedError();
      }
      job_done_cv_.SignalAll();
      continue;
    }
    it->second->FinishSegmentJob(job, made, std::move(file), &account_);
    job_done_cv_.SignalAll();
  }
  mu_.Unlock();
}

}  // namespace shmcache
