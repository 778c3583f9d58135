#include "lib/fork_safety.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <vector>

#include "port/mutex.h"

namespace shmcache {

namespace fork_internal {
std::atomic<uint64_t> g_fork_generation{0};
}  // namespace fork_internal

namespace {

using fork_internal::g_fork_generation;

constexpr int kRanks = kLockRanks;

// Every live ForkSafeMutex, by rank. Never destroyed: mutexes in objects
// that outlive static destruction (leaked caches, other libraries' statics)
// still unregister safely.
struct Registry {
  Mutex mu;
  std::vector<ForkSafeMutex*> by_rank[kRanks] GUARDED_BY(mu);
};

Registry& TheRegistry();

// The fork handlers lock and unlock every registered mutex, a set the
// analysis cannot name; LockAll returns holding them all.
void LockAll() NO_THREAD_SAFETY_ANALYSIS {
  Registry& r = TheRegistry();
  r.mu.Lock();
  for (auto& mutexes : r.by_rank) {
    for (ForkSafeMutex* m : mutexes) m->lock();
  }
}

void UnlockAll() NO_THREAD_SAFETY_ANALYSIS {
  Registry& r = TheRegistry();
  for (int k = kRanks; k-- > 0;) {
    for (ForkSafeMutex* m : r.by_rank[k]) m->unlock();
  }
  r.mu.Unlock();
}

void OnForkChild() {
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
  UnlockAll();
}

Registry& TheRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry;
    pthread_atfork(LockAll, UnlockAll, OnForkChild);
    return r;
  }();
  return *registry;
}

// Forks are counted from the library's load on, whether or not a mutex
// exists yet: ForkGeneration() stays a plain load on the hot path.
const bool g_registered = (TheRegistry(), true);

}  // namespace

ForkSafeMutex::ForkSafeMutex(LockRank rank) : rank_(rank) {
  assert(static_cast<int>(rank) >= 0 && static_cast<int>(rank) < kRanks);
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  r.by_rank[static_cast<int>(rank)].push_back(this);
}

ForkSafeMutex::~ForkSafeMutex() {
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  auto& mutexes = r.by_rank[static_cast<int>(rank_)];
  auto it = std::find(mutexes.begin(), mutexes.end(), this);
  if (it != mutexes.end()) {
    *it = mutexes.back();
    mutexes.pop_back();
  }
}

}  // namespace shmcache
