// CPU a fresh fill costs per row, the writer's and the daemon's (issue 36
// item 2, docs/performance.md "The put path profiled again"): one process
// puts `rows` rows of `row_kb` KB, PutBatch of `batch` (1: Put), into a
// new cache of a new session, and prints its own CPU (getrusage) and the
// daemon's (/proc/PID/stat) around the puts, per row. CPU, not walls: the
// project's machine is shared. With `spill` the cache is a 1 MB spilling
// one, so that (past its first MB) the rows go to the daemon's RocksDB
// (issue 36 item 4); the wall rate is printed too.
//
//   put_fill_cpu PORT DAEMON_PID ROW_KB ROWS [BATCH] [spill]
//
// Run by hand, against a server started with its own run dir. Measures;
// asserts nothing but that every row was stored.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/by_hand.h"
#include "shmcache/client.h"

namespace {

using shmcache::Status;
using shmcache::by_hand::Fail;
using shmcache::by_hand::Now;

double DaemonCpu(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double OwnCpu() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6;
  };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: put_fill_cpu PORT DAEMON_PID ROW_KB ROWS [BATCH] [spill]\n");
    return 2;
  }
  const int port = std::atoi(argv[1]), pid = std::atoi(argv[2]);
  const size_t row_bytes = std::strtoull(argv[3], nullptr, 10) << 10;
  const uint64_t rows = std::strtoull(argv[4], nullptr, 10);
  const size_t batch = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 64;
  const bool spill = argc > 6 && std::string(argv[6]) == "spill";
  std::unique_ptr<shmcache::Client> client;
  std::unique_ptr<shmcache::Cache> cache;
  uint32_t session = 0;
  Status s;
  if (const char* step = shmcache::by_hand::OpenInNewSession(
          port,
          {.fingerprint = "put-fill-cpu",
           .size_mb = spill ? 1 : row_bytes * rows * 5 / 4 / (1 << 20) + 64,
           .spill_requested = spill},
          &client, &session, &cache, &s)) {
    return Fail(step, s);
  }
  std::vector<unsigned char> data(row_bytes * batch);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131);
  const int64_t shape[1] = {static_cast<int64_t>(row_bytes)};
  std::vector<shmcache::ColumnRef> cols(batch);
  std::vector<std::span<const shmcache::ColumnRef>> refs(batch);
  for (size_t i = 0; i < batch; ++i) {
    cols[i] = {.name = "data",
               .shape = shape,
               .data = &data[i * row_bytes],
               .nbytes = row_bytes};
    refs[i] = std::span(&cols[i], 1);
  }
  std::vector<uint64_t> ids(batch);
  std::vector<Status> statuses(batch);
  const double d0 = DaemonCpu(pid), c0 = OwnCpu(), t0 = Now();
  for (uint64_t first = 0; first < rows; first += batch) {
    const size_t n = std::min<uint64_t>(batch, rows - first);
    for (size_t i = 0; i < n; ++i) ids[i] = first + i;
    if (batch == 1) {
      statuses[0] = cache->Put(ids[0], refs[0]);
    } else {
      s = cache->PutBatch(std::span(ids.data(), n), std::span(refs.data(), n),
                          std::span(statuses.data(), n));
      if (!s.ok()) return Fail("put", s);
    }
    for (size_t i = 0; i < n; ++i) {
      if (!statuses[i].ok()) return Fail("row", statuses[i]);
    }
  }
  const double t1 = Now(), c1 = OwnCpu(), d1 = DaemonCpu(pid);
  std::printf(
      "row_kb=%zu rows=%llu batch=%zu rows_per_s=%.0f writer_us=%.3f daemon_us=%.3f "
      "total_us=%.3f\n",
      row_bytes >> 10, static_cast<unsigned long long>(rows), batch,
      static_cast<double>(rows) / (t1 - t0), (c1 - c0) * 1e6 / static_cast<double>(rows),
      (d1 - d0) * 1e6 / static_cast<double>(rows),
      (c1 - c0 + d1 - d0) * 1e6 / static_cast<double>(rows));
  cache.reset();
  return client->DestroySession(session).ok() ? 0 : 1;
}
