// The measured sections. Each one adds its figures (or a skip with its
// reason) to the report. `src` holds config.working_set random bytes: row i
// of size S is src + i * S, the same rows for every system.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "benchmarks/bench_util.h"
#include "shmcache/status.h"

namespace shmcache {
class Cache;
class Client;
}  // namespace shmcache

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
void BenchSpillCheck(const Config& c, const Source& src, Report* r);
void BenchSweep(const Config& c, const Source& src, Report* r);

// Shared by the sections (bench_shmcache.cc).
// The server's shm dir (its own huge-page tmpfs when it mounted one).
std::string ShmDirOf(int port);
// Opens cache `name` of `session` (fingerprint "bench:<name>").
shmcache::Status OpenBenchCache(shmcache::Client* client, uint32_t session,
                                const std::string& name, bool spilling, uint64_t size_mb,
                                std::unique_ptr<shmcache::Cache>* out);
// Puts rows [begin, end) of `size` bytes and returns rows/s, or -1 after an
// error (*err says which). With batch > 1 the rows go through PutBatch,
// `batch` at a time.
double PutRange(shmcache::Cache* cache, const Source& src, size_t size, uint64_t begin,
                uint64_t end, std::string* err, size_t batch = 1);
// Reads every row 0..n-1 once, touching each of its pages.
bool WarmUp(shmcache::Cache* cache, uint64_t n);
// Rows of `size` per second that fresh pages of `dir` are made at by one
// thread, fallocated and written once through the descriptor; -1 on error.
double PageSupplyRate(const std::string& dir, uint64_t n, size_t size);

// Keeps the compiler from dropping a computation whose result is unused.
template <typename T>
inline void DoNotOptimize(const T& v) {
  asm volatile("" : : "r,m"(v) : "memory");
}

}  // namespace bench
