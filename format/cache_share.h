// CacheShareBytes: the bytes of the last-level cache one CPU can count on
// (the cache's size over the CPUs that share it). A copy whose destinations
// together exceed it will not find them cached when it writes them, nor
// leave them cached for the reader: that is when non-temporal stores pay
// (row_copy.h).
// Thread safety: any thread. CacheShareBytes reads sysfs on its first call
// in a process (and on any call racing it) and keeps the value, without a
// lock (safe across fork); CacheShareBytesAt is stateless.
#pragma once

#include <cstddef>
#include <string>

namespace shmcache {

// Used where sysfs says nothing (no /sys, an odd format): a typical server's
// share (a 32 MB L3 over 8 cores, 16 MB over 4).
inline constexpr size_t kDefaultCacheShareBytes = 4u << 20;

// The share of cpu0's highest-level data or unified cache, read from
// /sys/devices/system/cpu/cpu0/cache; kDefaultCacheShareBytes when that is
// unreadable. (sysconf(_SC_LEVEL3_CACHE_SIZE) is not used: under KVM on the
// project's VM it says 384 MB, sysfs the true 32 MB.)
size_t CacheShareBytes();

// The same read from `cache_dir` (a directory of index<N>/ entries, each
// with level, type, size such as "32768K" and shared_cpu_list such as
// "0-3,8-11"): 0 when no entry there is readable. Tests plant such trees.
size_t CacheShareBytesAt(const std::string& cache_dir);

}  // namespace shmcache
