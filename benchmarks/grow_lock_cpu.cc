// CPU the daemon's store lock is held for one index growth (docs/
// hit-path.md "One index table at 1 Mi rows"), in thread CPU time, for a
// newest table of 2^LOG2 slots filled to its limit (3/4), grown into one
// of twice its slots. Two ways in turn, in the same run, several rounds,
// the order alternating:
//   - one_call: CacheState::GrowIndex, every step in one call, as the
//     store ran the growth under its lock before session 21 (and as the
//     spill path still does);
//   - split: the steps as Store::GrowIndex runs them, only BeginGrowth,
//     FinishGrowth (publish and copy) and EndGrowth under the lock;
//     MakeTable (the file, its pages allocated, cleared and mapped) and
//     FreeCompacted (the older slots' MADV_REMOVE) without it, their CPU
//     printed too: it moved, it did not vanish.
//
//   grow_lock_cpu [LOG2 [ROUNDS]]     (defaults 20 and 5)
//
// Run by hand; needs /dev/shm room for about 2 x 2^(LOG2+5) bytes. Prints
// a table and a JSON line; ratios are of the medians of this run.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/cache_state.h"
#include "daemon/memory_account.h"
#include "format/index_table.h"
#include "format/instance.h"
#include "format/layout.h"
#include "format/shm_file.h"

namespace shmcache {
namespace {

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

[[noreturn]] void Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "grow_lock_cpu: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

struct Sample {
  double lock_ms = 0;  // the steps under the lock
  double make_ms = 0;  // split: MakeTable, without it
  double free_ms = 0;  // split: FreeCompacted, without it
};

// One growth past a newest table of 2^log2 slots filled to its limit.
Sample GrowOnce(uint32_t log2, bool split, int round) {
  char dir[] = "/dev/shm/grow_lock_cpu.XXXXXX";
  if (mkdtemp(dir) == nullptr) Fail("mkdtemp /dev/shm", Status::IOError("mkdtemp"));
  char run[] = "/tmp/grow_lock_cpu_run.XXXXXX";
  if (mkdtemp(run) == nullptr) Fail("mkdtemp /tmp", Status::IOError("mkdtemp"));
  InstancePaths paths = MakeInstancePaths(45000 + round, run, dir);
  MemoryAccount account;
  account.cap = 8ULL << 30;
  std::unique_ptr<CacheState> cache;
  Status s = CacheState::Create(paths, 1, 1, "grow", "fp", 0, false, 1, &account, nullptr,
                                &cache);
  if (!s.ok()) Fail("create", s);
  ShmFile header;
  if (!(s = ShmFile::Open(paths.CacheFile(1), &header)).ok()) Fail("open header", s);
  auto* h = reinterpret_cast<layout::CacheHeader*>(header.data());
  // Grown (empty) until the newest table has 2^log2 slots.
  while (h->tables[h->num_tables.load() - 1].capacity.load() < (1ULL << log2)) {
    if (!(s = cache->GrowIndex(h->num_tables.load(), &account)).ok()) Fail("grow", s);
  }
  const uint32_t n = h->num_tables.load();
  ShmFile newest_file;
  s = ShmFile::Open(paths.TableFile(1, n - 1, h->tables[n - 1].tag), &newest_file);
  if (!s.ok()) Fail("open table", s);
  IndexTable newest(reinterpret_cast<layout::TableHeader*>(newest_file.data()));
  for (uint64_t id = 0; id < newest.limit(); ++id) {
    newest.Insert(id + 1, layout::MakeLocation(1, 4096 + 64 * id));
  }
  Sample out;
  if (!split) {
    const double t0 = ThreadCpuMs();
    s = cache->GrowIndex(n, &account);
    out.lock_ms = ThreadCpuMs() - t0;
  } else {
    CacheState::Growth g;
    bool needed = false;
    double t0 = ThreadCpuMs();
    s = cache->BeginGrowth(n, &account, &g, &needed);
    out.lock_ms += ThreadCpuMs() - t0;
    if (!s.ok() || !needed) Fail("begin", s);
    ShmFile made;
    uint32_t tag = 0;
    std::string skipped;
    t0 = ThreadCpuMs();
    Status m = CacheState::MakeTable(paths, 1, g, &made, &tag, &skipped);
    out.make_ms = ThreadCpuMs() - t0;
    t0 = ThreadCpuMs();
    s = cache->FinishGrowth(&g, m, std::move(made), tag, &account);
    out.lock_ms += ThreadCpuMs() - t0;
    t0 = ThreadCpuMs();
    CacheState::FreeCompacted(&g);
    out.free_ms = ThreadCpuMs() - t0;
    t0 = ThreadCpuMs();
    cache->EndGrowth(&g, &account);
    out.lock_ms += ThreadCpuMs() - t0;
  }
  if (!s.ok()) Fail("the timed growth", s);
  if (h->first_table.load() != n) Fail("not compacted", Status::OK());
  header.Unmap();
  newest_file.Unmap();
  cache->Destroy(&account);
  rmdir(dir);
  rmdir(run);
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace shmcache

int main(int argc, char** argv) {
  using shmcache::GrowOnce;
  const auto log2 = static_cast<uint32_t>(argc > 1 ? std::atoi(argv[1]) : 20);
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  if (log2 < 18 || log2 > 26 || rounds < 1) {
    std::fprintf(stderr, "usage: grow_lock_cpu [LOG2 (18-26) [ROUNDS]]\n");
    return 2;
  }
  std::vector<double> one, split, make, freed;
  std::printf("round  one_call_ms  split_lock_ms  (off the lock: make_ms, free_ms)\n");
  for (int r = 0; r < rounds; ++r) {
    shmcache::Sample a, b;
    if (r % 2 == 0) {
      a = GrowOnce(log2, false, 2 * r);
      b = GrowOnce(log2, true, 2 * r + 1);
    } else {
      b = GrowOnce(log2, true, 2 * r + 1);
      a = GrowOnce(log2, false, 2 * r);
    }
    one.push_back(a.lock_ms);
    split.push_back(b.lock_ms);
    make.push_back(b.make_ms);
    freed.push_back(b.free_ms);
    std::printf("%5d  %11.2f  %13.2f  (%.2f, %.2f)\n", r, a.lock_ms, b.lock_ms, b.make_ms,
                b.free_ms);
  }
  using shmcache::Median;
  const double mo = Median(one), ms = Median(split);
  std::printf("median %10.2f  %13.2f  (%.2f, %.2f); split/one_call %.3f\n", mo, ms,
              Median(make), Median(freed), ms / mo);
  std::printf(
      "{\"log2\": %u, \"rounds\": %d, \"one_call_ms\": %.3f, \"split_lock_ms\": %.3f, "
      "\"make_ms\": %.3f, \"free_ms\": %.3f, \"ratio\": %.4f}\n",
      log2, rounds, mo, ms, Median(make), Median(freed), ms / mo);
  return 0;
}
