#include "format/cache_share.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string_view>

namespace shmcache {

namespace {

std::string FirstLine(const std::string& path) {
  std::string line;
  std::ifstream in(path);
  std::getline(in, line);
  return line;
}

// "32768K", "1M", "512": bytes, 0 when malformed.
size_t ParseSize(const std::string& s) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return 0;
  const std::string_view unit(end);
  if (unit.empty()) return v;
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  if (unit == "G") return v << 30;
  return 0;
}

// "0-3,8-11", "5": the number of CPUs listed, 0 when malformed.
size_t CountCpus(const std::string& list) {
  size_t count = 0;
  const char* p = list.c_str();
  while (*p != '\0') {
    char* end = nullptr;
    const unsigned long first = std::strtoul(p, &end, 10);
    if (end == p) return 0;
    unsigned long last = first;
    p = end;
    if (*p == '-') {
      last = std::strtoul(p + 1, &end, 10);
      if (end == p + 1 || last < first) return 0;
      p = end;
    }
    count += last - first + 1;
    if (*p == ',') ++p;
    else if (*p != '\0') return 0;
  }
  return count;
}

}  // namespace

size_t CacheShareBytesAt(const std::string& cache_dir) {
  int best_level = 0;
  size_t share = 0;
  // Kernels list a CPU's caches as index0..index<N-1>, with N at most a few.
  for (int i = 0; i < 16; ++i) {
    const std::string dir = cache_dir + "/index" + std::to_string(i) + "/";
    const std::string type = FirstLine(dir + "type");
    if (type != "Unified" && type != "Data") continue;
    const int level = std::atoi(FirstLine(dir + "level").c_str());
    const size_t size = ParseSize(FirstLine(dir + "size"));
    const size_t cpus = CountCpus(FirstLine(dir + "shared_cpu_list"));
    if (level <= best_level || size == 0 || cpus == 0) continue;
    best_level = level;
    share = size / cpus;
  }
  return share;
}

size_t CacheShareBytes() {
  // Not a function-local static: its initialisation guard, held by a
  // thread while it reads sysfs, would stay held in a child forked then,
  // and the child's first large copy would wait on it for good. Threads
  // that race here read the same files and store the same value.
  static std::atomic<size_t> known{0};
  size_t share = known.load(std::memory_order_relaxed);
  if (share == 0) {
    share = CacheShareBytesAt("/sys/devices/system/cpu/cpu0/cache");
    if (share == 0) share = kDefaultCacheShareBytes;
    known.store(share, std::memory_order_relaxed);
  }
  return share;
}

}  // namespace shmcache
