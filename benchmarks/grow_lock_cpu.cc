// CPU the daemon's store lock is held for one index growth (docs/
// hit-path.md "The next table made ahead"): CacheState::GrowIndex, timed
// in thread CPU time, for a newest table of 2^LOG2 slots filled to its
// limit (3/4), grown into one of twice its slots. Two ways in turn, in the
// same run, several rounds, the order alternating:
//   - under_lock: the table is made by the growth (its file created, its
//     pages reserved and cleared, then faulted in by the copy);
//   - made_ahead: made before by CacheState::RunTableJob, as the store's
//     preparer does off the lock, so that the growth only publishes it and
//     copies (that job's own CPU is printed too: it moved, not vanished).
//
//   grow_lock_cpu [LOG2 [ROUNDS]]     (defaults 20 and 5)
//
// Run by hand; needs /dev/shm room for about 2 x 2^(LOG2+5) bytes. Prints
// a table and a JSON line; ratios are of the medians of this run.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
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
  double lock_ms = 0;  // GrowIndex
  double job_ms = 0;   // RunTableJob (made_ahead only)
};

// One growth past a newest table of 2^log2 slots filled to its limit.
Sample GrowOnce(uint32_t log2, bool ahead, int round) {
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
  if (ahead) {
    std::optional<SegmentJob> job = cache->TakeTableJob(&account);
    if (!job) Fail("no table job", Status::OK());
    ShmFile made;
    uint32_t tag = 0;
    std::string skipped;
    const double t0 = ThreadCpuMs();
    s = CacheState::RunTableJob(paths, *job, &made, &tag, &skipped);
    out.job_ms = ThreadCpuMs() - t0;
    if (!s.ok()) Fail("table job", s);
    cache->FinishTableJob(*job, s, std::move(made), tag, &account);
  }
  const double t0 = ThreadCpuMs();
  s = cache->GrowIndex(n, &account);
  out.lock_ms = ThreadCpuMs() - t0;
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
  std::vector<double> under, ahead, job;
  std::printf("round  under_lock_ms  made_ahead_ms  (its job, off the lock, ms)\n");
  for (int r = 0; r < rounds; ++r) {
    shmcache::Sample a, b;
    if (r % 2 == 0) {
      a = GrowOnce(log2, false, 2 * r);
      b = GrowOnce(log2, true, 2 * r + 1);
    } else {
      b = GrowOnce(log2, true, 2 * r + 1);
      a = GrowOnce(log2, false, 2 * r);
    }
    under.push_back(a.lock_ms);
    ahead.push_back(b.lock_ms);
    job.push_back(b.job_ms);
    std::printf("%5d  %13.2f  %13.2f  (%.2f)\n", r, a.lock_ms, b.lock_ms, b.job_ms);
  }
  const double mu = shmcache::Median(under), ma = shmcache::Median(ahead);
  std::printf("median %12.2f  %13.2f  (%.2f); made_ahead/under_lock %.3f\n", mu, ma,
              shmcache::Median(job), ma / mu);
  std::printf(
      "{\"log2\": %u, \"rounds\": %d, \"under_lock_ms\": %.3f, \"made_ahead_ms\": %.3f, "
      "\"job_ms\": %.3f, \"ratio\": %.4f}\n",
      log2, rounds, mu, ma, shmcache::Median(job), ma / mu);
  return 0;
}
