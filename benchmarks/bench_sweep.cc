// The host sweep (issue 36): the same measures by 1, 2, 4, ... up to the
// CPUs of the machine (--sweep), to see whether the cache scales to the
// host it runs on:
//   - page supply: fresh shm pages made by T threads at once, each its own
//     files, fallocated and written once through the descriptor (the
//     machine's limit for puts into a fresh cache with T cores making
//     pages: PageSupplyRate in bench_shmcache.cc says why);
//   - PutBatch of 64 by P processes into one fresh cache, 3 KB and 150 KB
//     rows, each process writing kPutBytesPerProc;
//   - GetBatch of 64 random ids by P processes, 150 KB and 600 KB rows,
//     next to memcpy of random rows of the same working set by P processes.
// Every figure is a rate summed over the threads or processes; the report
// sets each against its P = 1 figure and its same-P reference.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/sections.h"
#include "shmcache/client.h"

namespace bench {
namespace {

using shmcache::Cache;
using shmcache::Status;

constexpr size_t kBatch = 64;
constexpr int kRounds = 3;
// What each writer (a page-supply thread or a PutBatch process) writes:
// enough that the P = 1 figure takes a good fraction of a second here.
constexpr uint64_t kPutBytesPerProc = 256u << 20;
// Files of the page supply: a segment's usual size.
constexpr uint64_t kSupplyFileBytes = 64u << 20;

// Fresh pages of `dir`, `bytes` per thread, made by `threads` threads at once
// in files of kSupplyFileBytes (fallocate, then zeros written in 1 MB blocks,
// as PageSupplyRate makes them). Bytes per second over all of them; -1 when
// a file could not be made.
double SupplyRate(const std::string& dir, int threads, uint64_t bytes) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, failed{false};
  std::vector<double> took(static_cast<size_t>(threads), 0);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      static const std::vector<char> zeros(1u << 20, 0);
      std::vector<int> fds;
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      const double t0 = NowSec();
      for (uint64_t done = 0; done < bytes && !failed.load();) {
        const uint64_t size = std::min(kSupplyFileBytes, bytes - done);
        std::string path = dir + "/shmcache-bench-sweep." + std::to_string(getpid()) +
                           "." + std::to_string(t) + "." + std::to_string(fds.size());
        int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
          failed.store(true);
          break;
        }
        unlink(path.c_str());
        fds.push_back(fd);
        bool ok = ftruncate(fd, static_cast<off_t>(size)) == 0 &&
                  posix_fallocate(fd, 0, static_cast<off_t>(size)) == 0;
        for (uint64_t off = 0; ok && off < size;) {
          ssize_t w =
              pwrite(fd, zeros.data(), std::min<uint64_t>(zeros.size(), size - off),
                     static_cast<off_t>(off));
          ok = w > 0;
          if (ok) off += static_cast<uint64_t>(w);
        }
        if (!ok) failed.store(true);
        done += size;
      }
      took[static_cast<size_t>(t)] = NowSec() - t0;
      for (int fd : fds) close(fd);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  go.store(true);
  for (std::thread& th : pool) th.join();
  if (failed.load()) return -1;
  const double wall = *std::max_element(took.begin(), took.end());
  return static_cast<double>(bytes) * threads / wall;
}

// PutBatch of kBatch rows by `procs` processes into one fresh cache of its
// own session; rows/s over all of them, -1 on a failure.
double SweepPuts(shmcache::Client* client, const Source& src, size_t size, int procs,
                 std::string* err) {
  uint32_t session = 0;
  std::unique_ptr<Cache> cache;
  Status s = client->CreateSession(&session);
  if (s.ok())
    s = OpenBenchCache(client, session, "sweep-put-" + std::to_string(size), false, 0,
                       &cache);
  if (!s.ok()) {
    *err = s.ToString();
    if (session) client->DestroySession(session).PermitUncheckedError();
    return -1;
  }
  const uint64_t per = kPutBytesPerProc / size;
  double rate = RunProcs(procs, [&](int child) {
    std::string why;
    const uint64_t begin = per * static_cast<uint64_t>(child);
    double rr = PutRange(cache.get(), src, size, begin, begin + per, &why, kBatch);
    if (rr < 0) std::fprintf(stderr, "sweep put: %s\n", why.c_str());
    return rr;
  });
  cache.reset();
  client->DestroySession(session).PermitUncheckedError();
  if (rate < 0) *err = "a put failed";
  return rate;
}

// One cache holding the working set of `size` rows; GetBatch of kBatch
// random ids by each count of processes, next to memcpy of random rows of
// the same working set by as many processes.
void SweepGets(const Config& c, shmcache::Client* client, const Source& src, size_t size,
               Report* r) {
  const std::string k = std::to_string(size);
  const uint64_t n = c.RowsFor(size);
  uint32_t session = 0;
  std::unique_ptr<Cache> cache;
  Status s = client->CreateSession(&session);
  if (s.ok()) s = OpenBenchCache(client, session, "sweep-get-" + k, false, 0, &cache);
  std::string err;
  if (s.ok() && PutRange(cache.get(), src, size, 0, n, &err, kBatch) < 0) {
    s = Status::IOError(err);
  }
  if (!s.ok()) {
    r->Skip("sweep get " + k, s.ToString());
    if (session) client->DestroySession(session).PermitUncheckedError();
    return;
  }
  const std::vector<uint32_t> idx =
      RandomIndices(1u << 20, static_cast<uint32_t>(n), 42 + size);
  // Interleaved rounds, best of each: on a shared machine the ratio is then
  // same-time.
  for (int p : c.sweep) {
    double copy = -1, get = -1;
    for (int round = 0; round < kRounds; ++round) {
      copy = std::max(copy, RunProcs(p, [&](int child) {
                        std::vector<std::vector<uint64_t>> dst(
                            kBatch, std::vector<uint64_t>((size + 7) / 8));
                        std::vector<uint64_t> ids(kBatch);
                        const uint64_t off = static_cast<uint64_t>(child) * 7919;
                        return TimedRateBatched(c.seconds, kBatch, [&](uint64_t i) {
                          FillBatch(idx, i, off, &ids);
                          for (size_t j = 0; j < kBatch; ++j) {
                            std::memcpy(dst[j].data(), src.Row(ids[j], size), size);
                          }
                          DoNotOptimize(dst[0].data());
                        });
                      }));
      double g = RunProcs(p, [&](int child) {
        std::vector<shmcache::Row> rows(kBatch);
        std::vector<Status> sts(kBatch);
        std::vector<uint64_t> ids(kBatch);
        const uint64_t off = static_cast<uint64_t>(child) * 7919;
        bool ok = WarmUp(cache.get(), n);
        double rr = TimedRateBatched(c.seconds, kBatch, [&](uint64_t i) {
          FillBatch(idx, i, off, &ids);
          ok &= cache->GetBatch(ids, rows, sts).ok();
          for (const Status& st : sts) ok &= st.ok();
          DoNotOptimize(&rows[0]);
        });
        return ok ? rr : -1;
      });
      if (g < 0) {
        get = -1;
        break;
      }
      get = std::max(get, g);
    }
    if (copy > 0) r->Add("sweep", "memcpy", "random rows", size, p, copy);
    if (get < 0) r->Skip("sweep get batch " + k + " P=" + std::to_string(p), "failed");
    else r->Add("sweep", "shmcache", "GetBatch 64", size, p, get);
  }
  cache.reset();
  client->DestroySession(session).PermitUncheckedError();
}

}  // namespace

void BenchSweep(const Config& c, const Source& src, Report* r) {
  shmcache::ClientOptions co;
  co.port = c.port;
  std::unique_ptr<shmcache::Client> client;
  Status s = shmcache::Client::Connect(co, &client);
  if (!s.ok()) {
    r->Skip("sweep", "cannot connect: " + s.ToString());
    return;
  }
  const std::string dir = ShmDirOf(c.port);
  r->Value("sweep.cpus", static_cast<double>(std::thread::hardware_concurrency()));
  for (int t : c.sweep) {
    double bytes = SupplyRate(dir, t, kPutBytesPerProc);
    if (bytes < 0)
      r->Skip("sweep page supply T=" + std::to_string(t), "cannot write " + dir);
    else r->Add("sweep", "shm pages", "fallocate+clear", 1, t, bytes);
  }
  for (size_t size : {size_t{3} * 1024, size_t{150} * 1024}) {
    for (int p : c.sweep) {
      std::string err;
      double rate = SweepPuts(client.get(), src, size, p, &err);
      if (rate < 0) r->Skip("sweep put " + std::to_string(size), err);
      else r->Add("sweep", "shmcache", "PutBatch 64", size, p, rate);
    }
  }
  for (size_t size : {size_t{150} * 1024, size_t{600} * 1024}) {
    SweepGets(c, client.get(), src, size, r);
  }
}

}  // namespace bench
