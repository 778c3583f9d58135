// Fork safety: a process may fork() while other threads are inside the
// library (PyTorch forks DataLoader workers while the trainer's threads
// run). The child has only the forking thread, so a mutex that another
// thread held at the fork would stay locked in the child forever.
//
// ForkSafeMutex is the library's process-local mutex. Every live one is
// registered; a pthread_atfork prepare handler takes them all, in rank
// order, so that fork() happens only where no thread holds one, and the
// parent and child handlers release them. The state they guard is thus
// consistent in the child, which then sees ForkGeneration() changed and
// re-creates what belongs to one process (its connection, its chunks).
//
// Cost: fork() waits for the library's critical sections in flight; the
// longest is one daemon round trip (bounded by the request timeout).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "port/thread_annotations.h"

namespace shmcache {

namespace fork_internal {
extern std::atomic<uint64_t> g_fork_generation;
}  // namespace fork_internal

// Incremented in every child process right after fork(). Inline: the
// single-row hit path reads it on every hit.
inline uint64_t ForkGeneration() {
  return fork_internal::g_fork_generation.load(std::memory_order_relaxed);
}

// The library's lock order. A thread that holds a mutex of one rank takes
// only mutexes of a later rank, and never two of the same rank.
enum class LockRank : int {
  kCachePut = 0,         // ChunkWriter::mu_ (a put then maps segments and tables,
                         // calls the daemon)
  kSpillStage = 1,       // SpillStage::mu_ (stages rows, calls the daemon)
  kCacheTables = 2,      // TableSet::mu_
  kCacheSegments = 3,    // SegmentSet::mu_
  kClient = 4,           // ClientImpl::mu_ (one daemon round trip)
  kClientPaths = 5,      // ClientImpl::paths_mu_ (a copy of the paths)
  kSpillReaders = 6,     // the process's spill readers (spill_reader.cc)
  kSpillReaderOpen = 7,  // held while a spill reader (RocksDB) is opened or
                         // closed: a child forked then would inherit
                         // RocksDB's global state half made (spill_reader.cc;
                         // a leaf)
};
// The number of ranks: the last one's value + 1 (a rank added after the
// last must move this along).
inline constexpr int kLockRanks = static_cast<int>(LockRank::kSpillReaderOpen) + 1;

// A std::mutex (Lockable) that fork() never finds held.
//
// REQUIRES: not constructed or destroyed while the thread holds a
// ForkSafeMutex (registration takes the registry's lock, which the prepare
// handler holds while it waits for them).
class CAPABILITY("mutex") ForkSafeMutex {
 public:
  explicit ForkSafeMutex(LockRank rank);
  ~ForkSafeMutex();
  ForkSafeMutex(const ForkSafeMutex&) = delete;
  ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // False when `deadline` passed before the mutex was free. The wait is
  // on the system clock: libstdc++ waits for a steady_clock deadline with
  // pthread_mutex_clocklock, which ThreadSanitizer (clang 14) does not
  // intercept, so each later unlock read as an unlock of an unlocked mutex.
  // A wall-clock step during the wait only moves this one wait's end.
  bool try_lock_until(std::chrono::steady_clock::time_point deadline) TRY_ACQUIRE(true) {
    return mu_.try_lock_until(std::chrono::system_clock::now() +
                              (deadline - std::chrono::steady_clock::now()));
  }
  // Tells the analysis the caller holds the mutex, where it cannot see it
  // (a lock taken through a std::unique_lock); checks nothing at run time.
  void AssertHeld() ASSERT_CAPABILITY(this) {}

  LockRank rank() const { return rank_; }

 private:
  std::timed_mutex mu_;
  const LockRank rank_;
};

// Holds a ForkSafeMutex for its scope (std::lock_guard, which the
// analysis cannot see through).
class SCOPED_CAPABILITY ForkSafeLock {
 public:
  explicit ForkSafeLock(ForkSafeMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  // Takes over a mutex the caller locked (try_lock_until).
  ForkSafeLock(ForkSafeMutex* mu, std::adopt_lock_t) REQUIRES(mu) : mu_(mu) {}
  ~ForkSafeLock() RELEASE() { mu_->unlock(); }
  ForkSafeLock(const ForkSafeLock&) = delete;
  ForkSafeLock& operator=(const ForkSafeLock&) = delete;

 private:
  ForkSafeMutex* const mu_;
};

}  // namespace shmcache
