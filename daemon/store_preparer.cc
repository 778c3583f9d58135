// The segment preparers: threads that create the segments caches will
// lease next and supply (allocate and clear) their pages a step ahead of
// need, off the connections' threads, several at once when writers need
// them faster than one thread makes them (SegmentAllocator::
// TakeSegmentJobs, TakeSupplyJobs); the first one also retries connection
// releases and settles held memory between jobs.

#include "daemon/store.h"

#include <algorithm>
#include <exception>

#include <fmt/format.h>

#include "daemon/logger.h"

namespace shmcache {

namespace {

// Removes the file a job created (job.create), which nothing names yet. A
// job that supplies pages of an existing segment leaves its file alone:
// it is the cache's, holds rows, and goes with the cache.
void RemoveCreatedFile(const InstancePaths& paths, const SegmentJob& job) {
  if (job.create) {
    ShmFile::Unlink(paths.SegmentFile(job.cache_id, job.seg_no)).PermitUncheckedError();
  }
}

}  // namespace

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
  // The lock is let go (MutexUnlock) around each job and each scan of held
  // memory.
  MutexLock lock(&mu_);
  for (;;) {
    // A step that throws (an allocation) ends this pass, not the thread:
    // an exception let out of it would end the daemon (std::terminate).
    try {
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
          MutexUnlock unlocked(&mu_);
          SettleHeldMemory();
        }
      }
      if (stopping_) break;
      if (jobs_.empty()) continue;
      SegmentJob job = jobs_.front();
      jobs_.pop_front();
      RunSegmentJobLocked(job);
    } catch (...) {
      log_->Error("a segment preparer's step threw: {}; preparing on",
                  WhatThrew(std::current_exception()));
    }
  }
}

void Store::RunSegmentJobLocked(const SegmentJob& job) {
  // The job is this thread's until FinishSegmentJob hands it back to its
  // cache: a step that throws ends it as a failed job, or the cache would
  // wait for it for good (a lease for its segment, a destroy for
  // running_jobs_).
  bool registered = false;
  bool ran = false;  // RunSegmentJob returned `made`
  ShmFile file;
  Status made;
  std::exception_ptr thrown;
  try {
    AtLockedStep(LockedStep::kJobTaken);
    running_jobs_.insert(job.cache_id);
    registered = true;
    {
      MutexUnlock unlocked(&mu_);
      made = SegmentAllocator::RunSegmentJob(paths_, job, &file);
      ran = true;
    }
    AtLockedStep(LockedStep::kJobFinishing);
  } catch (...) {
    thrown = std::current_exception();
  }
  if (registered) running_jobs_.erase(running_jobs_.find(job.cache_id));
  if (thrown) {
    const bool made_file = (ran && made.ok()) || file.data() != nullptr;
    file.Unmap();
    if (made_file) RemoveCreatedFile(paths_, job);
    made = Status::IOError(
        fmt::format("preparing segment {} threw: {}", job.seg_no, WhatThrew(thrown)));
    log_->Error("cache {}: {}", job.cache_id, made.message());
  }
  auto it = caches_.find(job.cache_id);
  if (it == caches_.end()) {  // destroyed meanwhile; its memory was released
    file.Unmap();
    // A supplied file was removed with its cache (its id may be a new
    // cache's by now).
    RemoveCreatedFile(paths_, job);
  } else {
    CacheState* cache = it->second.get();
    try {
      cache->FinishSegmentJob(job, made, std::move(file), &account_, [this] {
        mu_.AssertHeld();  // called back under this scope's lock
        AtLockedStep(LockedStep::kJobKeeping);
      });
    } catch (...) {
      // Thrown while a made segment was kept, before anything changed
      // (SegmentAllocator::FinishSegmentJob): ended as a failed job, a file
      // it created removed, its memory released.
      RemoveCreatedFile(paths_, job);
      made = Status::IOError(fmt::format("keeping segment {} threw: {}", job.seg_no,
                                         WhatThrew(std::current_exception())));
      log_->Error("cache {}: {}", job.cache_id, made.message());
      cache->FinishSegmentJob(job, made, ShmFile(), &account_);
    }
  }
  job_done_cv_.SignalAll();
}

}  // namespace shmcache
