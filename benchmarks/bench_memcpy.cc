// The machine's limit: copying a random row out of a buffer larger than the
// last-level cache into a reused destination, as a copy-out get does.
#include <cstring>
#include <vector>

#include "benchmarks/sections.h"

namespace bench {

void BenchMemcpy(const Config& c, const Source& src, Report* r) {
  // How much P processes gain on this machine at all: a loop that touches
  // no memory. (Virtual CPUs may share a physical core.)
  for (int p : c.procs) {
    double rate = RunProcs(p, [&](int) {
      uint64_t x = 1;
      return TimedRate(c.seconds, [&](uint64_t i) {
        for (int k = 0; k < 64; ++k) x = x * 6364136223846793005ULL + i;
        DoNotOptimize(x);
      });
    });
    r->Add("cpu", "spin", "64 multiply-adds", 0, p, rate);
  }
  for (size_t size : kRowSizes) {
    const uint32_t n = static_cast<uint32_t>(c.RowsFor(size));
    const std::vector<uint32_t> idx = RandomIndices(1u << 20, n, 42 + size);
    for (int p : c.procs) {
      double rate = RunProcs(p, [&](int k) {
        std::vector<uint64_t> dst((size + 7) / 8);
        const uint64_t off = static_cast<uint64_t>(k) * 7919;
        return TimedRate(c.seconds, [&](uint64_t i) {
          std::memcpy(dst.data(), src.Row(idx[(i + off) & (idx.size() - 1)], size), size);
          DoNotOptimize(dst.data());
        });
      });
      r->Add("get", "memcpy", "random row", size, p, rate);
    }
  }
}

}  // namespace bench
