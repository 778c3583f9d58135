// The segment preparer: one thread that creates (allocates and clears)
// the segments caches will lease next, off the connections' threads, and
// between jobs retries connection releases and settles held memory.

#include "store.h"

namespace shmcache {

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

}  // namespace shmcache
