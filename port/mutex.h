// Mutex, MutexLock, MutexUnlock, CondVar: std::mutex and std::condition_variable with
// thread-safety annotations (port/thread_annotations.h). libstdc++'s
// std::mutex and std::lock_guard carry none, so clang's analysis cannot see
// what they lock; these thin wrappers (as leveldb's port::Mutex) can be
// named in GUARDED_BY and REQUIRES. They cost nothing over the std types.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "port/thread_annotations.h"

namespace shmcache {

class CondVar;

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis the caller holds the mutex, where it cannot see it
  // (a lock taken through a std::unique_lock); checks nothing at run time.
  void AssertHeld() ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Lets go of a Mutex the caller holds for its scope, and takes it again
// when the scope ends, normally or by an exception: the step between runs
// unlocked, and whatever follows (a catch, the holder's MutexLock) finds
// the mutex held as the analysis expects. Used inside a MutexLock's scope,
// instead of Unlock() ... Lock() by hand, which an exception thrown in
// between leaves unlocked for a MutexLock that then unlocks it again, or,
// thrown before, locked for good.
class SCOPED_CAPABILITY MutexUnlock {
 public:
  explicit MutexUnlock(Mutex* mu) RELEASE(mu) : mu_(mu) { mu_->Unlock(); }
  // RELEASE, as every scoped capability's destructor: the analysis reads
  // it as the scope's end, which for a scope that released takes the
  // mutex again (clang's unlocking scope).
  ~MutexUnlock() RELEASE() { mu_->Lock(); }
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable waited on with a Mutex held. Waits may wake
// spuriously: callers loop on their condition.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases *mu while waiting, holds it again on return.
  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, returning at `deadline` at the latest: false when it returns
  // because the deadline passed.
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline)
      REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace shmcache
