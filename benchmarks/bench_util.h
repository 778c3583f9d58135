// Shared pieces of the benchmark harness: timing, a deterministic random
// index stream, running a measurement in P forked processes, and the JSON
// result list.
//
// Every figure is a rate (rows/s and payload GB/s) measured for a fixed
// wall-clock duration; figures are meant to be compared as ratios with the
// references measured in the same run, never asserted.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace bench {

double NowSec();

// CPU seconds (user + system) that process `pid` used so far (its
// /proc/PID/stat, every thread); -1 when it cannot be read.
double ProcessCpuSec(int pid);
// CPU seconds of this process's children that have been waited for.
double ChildrenCpuSec();

// Random row indices in [0, n), the same sequence for every system measured
// on the same rows.
std::vector<uint32_t> RandomIndices(size_t count, uint32_t n, uint64_t seed);
// Batch i of ids.size() ids from idx (a power-of-two long list of random
// ids), starting `off` ids further for another process.
inline void FillBatch(const std::vector<uint32_t>& idx, uint64_t i, uint64_t off,
                      std::vector<uint64_t>* ids) {
  for (size_t k = 0; k < ids->size(); ++k) {
    (*ids)[k] = idx[(i * ids->size() + k + off) & (idx.size() - 1)];
  }
}

// Fills buf with pseudo-random bytes (touching every page).
void FillRandom(void* buf, size_t n, uint64_t seed);

// Runs op(i) for i = 0, 1, ... until `seconds` passed; returns ops/s.
// A short warm-up runs first and is not counted.
double TimedRate(double seconds, const std::function<void(uint64_t)>& op);
// Same, but op(i) does `batch` operations per call (pipelining). Both
// report the median of three runs of seconds/3.
double TimedRateBatched(double seconds, int batch,
                        const std::function<void(uint64_t)>& op);

// One run; op indices continue from *next.
double TimedRateOnce(double seconds, int batch, const std::function<void(uint64_t)>& op,
                     uint64_t* next);

// Forks `procs` children that start together; child k runs body(k) and
// reports the rate it returns. Returns the sum of the children's rates, or
// a negative number if a child failed.
double RunProcs(int procs, const std::function<double(int)>& body);

struct Result {
  std::string bench;    // "get", "view", "put", "memcpy", ...
  std::string system;   // "shmcache", "redis", "lmdb", "rocksdb", "memcpy"
  std::string variant;  // "copy-out", "zero-copy", "pipelined", ...
  size_t row_bytes = 0;
  int procs = 1;
  double rows_per_s = 0;
  double gb_per_s = 0;  // payload bytes (row_bytes) per second, 1e9
};

class Report {
 public:
  // quiet: Add does not print (a report gathered to be merged into another).
  explicit Report(bool quiet = false) : quiet_(quiet) {}
  void Add(const std::string& bench, const std::string& system,
           const std::string& variant, size_t row_bytes, int procs, double rows_per_s);
  void Skip(const std::string& what, const std::string& reason);
  void Value(const std::string& key, double v);  // free-form figures
  // Writes everything as one JSON object to `path` ("-" = stdout).
  bool Write(const std::string& path) const;
  const std::vector<Result>& results() const { return results_; }

 private:
  bool quiet_;
  std::vector<Result> results_;
  std::vector<std::pair<std::string, std::string>> skipped_;
  std::vector<std::pair<std::string, double>> values_;
};

// Row sizes of the issue: 3 KB, 150 KB, 600 KB.
inline constexpr size_t kRowSizes[] = {3 * 1024, 150 * 1024, 600 * 1024};
// Spilled rows and their RocksDB peer: the sizes the targets name
// (docs/performance.md#targets).
inline constexpr size_t kSpillRowSizes[] = {3 * 1024, 150 * 1024, 1024 * 1024};

// 1, 2, 4, ... below the CPUs of this machine, then the CPUs.
std::vector<int> DefaultSweep();

struct Config {
  double seconds = 0.4;             // per measurement
  size_t working_set = 512u << 20;  // bytes of rows per size (>> LLC)
  std::vector<int> procs = {1, 2};
  // Counts of the host sweep (bench_sweep.cc): 1, 2, 4, ... and the CPUs.
  std::vector<int> sweep = DefaultSweep();
  int pipeline_depth = 32;
  int port = 0;                       // shmcache instance
  std::string redis_socket;           // empty: skip Redis
  std::string lmdb_dir;               // empty: skip LMDB
  std::string rocksdb_dir;            // empty: skip raw RocksDB
  std::vector<std::string> sections;  // empty: all
  std::string out = "-";
  bool Wants(const std::string& s) const;
  size_t RowsFor(size_t row_bytes) const { return working_set / row_bytes; }
  // Processes for spilled-row reads and their peer: procs, and 4 (the
  // scaling target's count).
  std::vector<int> SpillProcs() const {
    std::vector<int> p = procs;
    if (std::find(p.begin(), p.end(), 4) == p.end()) p.push_back(4);
    return p;
  }
};

}  // namespace bench
