// The measured sections. Each one adds its figures (or a skip with its
// reason) to the report. `src` holds config.working_set random bytes: row i
// of size S is src + i * S, the same rows for every system.
#pragma once

#include "benchmarks/bench_util.h"

namespace bench {

struct Source {
  const char* data = nullptr;
  size_t size = 0;
  const char* Row(size_t i, size_t row_bytes) const {
    return data + (i * row_bytes) % (size - row_bytes + 1);
  }
};

void BenchMemcpy(const Config& c, const Source& src, Report* r);
void BenchPut(const Config& c, const Source& src, Report* r);
void BenchShmcache(const Config& c, const Source& src, Report* r);
void BenchHit(const Config& c, const Source& src, Report* r);
void BenchSpill(const Config& c, const Source& src, Report* r);
void BenchRedis(const Config& c, const Source& src, Report* r);
void BenchLmdb(const Config& c, const Source& src, Report* r);
void BenchRocksdb(const Config& c, const Source& src, Report* r);

// Keeps the compiler from dropping a computation whose result is unused.
template <typename T>
inline void DoNotOptimize(const T& v) {
  asm volatile("" : : "r,m"(v) : "memory");
}

}  // namespace bench
