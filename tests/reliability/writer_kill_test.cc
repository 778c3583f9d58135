// Writers killed with SIGKILL at random points inside Put or PutBatch,
// hundreds of times, while reader processes verify every row they read and
// a steady writer goes on. Shows: no torn or wrong read, no hang, no other
// client affected, and how much space each killed writer costs (bounded:
// the row it was writing, or a batch's window of rows written and not yet
// published, plus a chunk tail too small to recycle).
//
// Length: $SHMCACHE_KILL_SECONDS (default 20 s).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "format/layout.h"
#include "format/shm_file.h"
#include "lib/batch_window.h"
#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

constexpr uint64_t kRowsPerVictim = 64;
constexpr uint64_t kSteadyBase = 1ULL << 40;
constexpr size_t kMaxData = 8192;
constexpr int kReaders = 2;
constexpr uint64_t kMinRecycle = 16u << 10;  // SegmentAllocator::kMinRecycleBytes

struct Shared {
  std::atomic<uint64_t> ranges{0};  // victim id ranges handed out
  std::atomic<bool> stop{false};
  std::atomic<int> in_put{0};  // the current victim is inside Put
  std::atomic<uint64_t> reads_verified{0}, wrong_reads{0}, misses{0}, read_errors{0},
      steady_puts{0}, steady_errors{0}, victim_full{0};
  std::atomic<int> msg_taken{0};
  char msg[512];
  void Report(const std::string& m) {
    if (msg_taken.exchange(1) == 0) {
      std::snprintf(msg, sizeof msg, "%s", m.c_str());
    }
  }
};

Status Open(const TestDaemon& d, uint32_t sid, std::unique_ptr<Client>* c,
            std::unique_ptr<Cache>* cache) {
  Status s = Client::Connect(d.client_options(), c);
  if (!s.ok()) return s;
  return (*c)->OpenCache({.session_id = sid, .name = "kill", .fingerprint = "f"}, cache);
}

int Reader(const TestDaemon& d, uint32_t sid, const RowMaker& m, Shared* sh, int seed) {
  std::unique_ptr<Client> c;
  std::unique_ptr<Cache> cache;
  Status s = Open(d, sid, &c, &cache);
  if (!s.ok()) {
    sh->Report("reader open: " + s.ToString());
    return 2;
  }
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  Row row;
  std::string_view proj[2] = {"sum", "data"};
  for (uint64_t n = 0; !sh->stop.load(std::memory_order_relaxed); ++n) {
    uint64_t ranges = sh->ranges.load(std::memory_order_relaxed);
    uint64_t id;
    if (ranges == 0 || n % 8 == 0) {
      uint64_t done = sh->steady_puts.load(std::memory_order_relaxed);
      if (done == 0) continue;
      id = kSteadyBase + rng() % done;
    } else {
      id = (rng() % ranges) * kRowsPerVictim + rng() % kRowsPerVictim;
    }
    std::string bad;
    int mode = static_cast<int>(n % 3);
    if (mode == 0) {
      s = cache->Get(id, &row);
      if (s.ok()) bad = m.Verify(id, row.view());
    } else if (mode == 1) {
      RowView v;
      s = cache->View(id, &v);
      if (s.ok()) bad = m.Verify(id, v);
    } else {
      s = cache->Get(id, proj, &row);
      if (s.ok()) bad = m.VerifyProjection(id, row.view());
    }
    if (s.IsNotFound()) {
      sh->misses.fetch_add(1, std::memory_order_relaxed);
    } else if (!s.ok()) {
      sh->read_errors.fetch_add(1);
      sh->Report(fmt::format("read of row {}: {}", id, s.ToString()));
    } else if (!bad.empty()) {
      sh->wrong_reads.fetch_add(1);
      sh->Report(fmt::format("row {}: {}", id, bad));
    } else {
      sh->reads_verified.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return 0;
}

int Steady(const TestDaemon& d, uint32_t sid, const RowMaker& m, Shared* sh) {
  std::unique_ptr<Client> c;
  std::unique_ptr<Cache> cache;
  Status s = Open(d, sid, &c, &cache);
  if (!s.ok()) {
    sh->Report("steady open: " + s.ToString());
    return 2;
  }
  Row row;
  for (uint64_t i = 0; !sh->stop.load(std::memory_order_relaxed) && i < 100000; ++i) {
    uint64_t id = kSteadyBase + i;
    s = m.Put(*cache, id);
    if (s.ok()) s = cache->Get(id, &row);
    std::string bad = s.ok() ? m.Verify(id, row.view()) : "";
    if (!s.ok() || !bad.empty()) {
      sh->steady_errors.fetch_add(1);
      sh->Report(fmt::format("steady writer, row {}: {} {}", id, s.ToString(), bad));
      return 3;
    }
    sh->steady_puts.store(i + 1, std::memory_order_relaxed);
    // Paced: it stands for a trainer that also does other work.
    usleep(1000);
  }
  return 0;
}

int Victim(const TestDaemon& d, uint32_t sid, const RowMaker& m, Shared* sh,
           uint64_t range, int ready_fd) {
  std::unique_ptr<Client> c;
  std::unique_ptr<Cache> cache;
  Status s = Open(d, sid, &c, &cache);
  char ok = s.ok() ? 'R' : 'E';
  if (write(ready_fd, &ok, 1) != 1 || !s.ok()) return 2;
  // 0 to go on after a put, else the victim's exit code.
  auto outcome = [sh](const Status& put, const char* what) {
    if (put.IsFull()) {
      sh->victim_full.fetch_add(1);
      return 4;
    }
    if (!put.ok()) {
      sh->Report(std::string(what) + ": " + put.ToString());
      return 3;
    }
    return 0;
  };
  if (range % 2 == 1) {
    // Odd ranges are put with one PutBatch: its rows are written a window
    // at a time (through the segment's descriptor on 4 KB pages) and
    // published after; a kill lands between the two as often as not.
    std::vector<uint64_t> ids(kRowsPerVictim);
    for (uint64_t i = 0; i < kRowsPerVictim; ++i) ids[i] = range * kRowsPerVictim + i;
    sh->in_put.store(1, std::memory_order_relaxed);
    s = m.PutBatch(*cache, ids);
    sh->in_put.store(0, std::memory_order_relaxed);
    return outcome(s, "victim put_batch");
  }
  for (uint64_t i = 0; i < kRowsPerVictim; ++i) {
    sh->in_put.store(1, std::memory_order_relaxed);
    s = m.Put(*cache, range * kRowsPerVictim + i);
    sh->in_put.store(0, std::memory_order_relaxed);
    if (int end = outcome(s, "victim put")) return end;
  }
  return 0;
}

// Bytes of the index tables counted in reserved_bytes, read from the cache
// header: each file's size, or one page for a table compacted into a newer
// one (its slots were freed; CacheState::TableBytes).
uint64_t TableBytes(const TestDaemon& d, uint32_t cache_id) {
  ShmFile f;
  std::string path = fmt::format("{}/{}cache.{}", d.shm_dir(), d.shm_prefix(), cache_id);
  if (!ShmFile::Open(path, &f).ok()) return 0;
  auto* h = reinterpret_cast<layout::CacheHeader*>(f.data());
  uint64_t total = 0;
  for (uint32_t g = 0; g < h->num_tables.load(); ++g) {
    const uint64_t size = layout::TableFileSize(h->tables[g].capacity.load());
    total += g < h->first_table.load() ? std::min<uint64_t>(size, 4096) : size;
  }
  return total;
}

TEST(WriterKill, KilledWritersNeverTearRowsAndLeakLittle) {
  const double seconds = EnvSeconds("SHMCACHE_KILL_SECONDS", 20);
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  std::unique_ptr<Client> admin;
  ASSERT_TRUE(Client::Connect(d.client_options(), &admin).ok());
  uint32_t sid = 0;
  ASSERT_TRUE(admin->CreateSession(&sid).ok());
  std::unique_ptr<Cache> cache;
  // The kill phase stops at half the budget; a filler spends the rest.
  constexpr uint64_t kBudgetMb = 1024;
  ASSERT_TRUE(admin
                  ->OpenCache({.session_id = sid,
                               .name = "kill",
                               .fingerprint = "f",
                               .size_mb = kBudgetMb},
                              &cache)
                  .ok());
  const RowMaker m(kMaxData);
  Shared* sh = SharedBlock<Shared>();

  std::vector<pid_t> others;
  others.reserve(kReaders + 1);
  for (int r = 0; r < kReaders; ++r) {
    others.push_back(ForkChild([&, r] { return Reader(d, sid, m, sh, r + 1); }));
  }
  others.push_back(ForkChild([&] { return Steady(d, sid, m, sh); }));

  std::mt19937_64 rng(std::random_device{}());
  uint64_t kills = 0, kills_in_put = 0, batch_kills = 0, completed = 0, spawned = 0;
  double ema_us = 3000;  // how long a victim takes to write its rows
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
        .count();
  };
  bool victim_failed = false;
  CacheStats now;
  while (elapsed() < seconds && !victim_failed && sh->victim_full.load() == 0 &&
         cache->GetStats(&now).ok() && now.mem_bytes < (kBudgetMb << 19)) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    uint64_t range = sh->ranges.fetch_add(1);
    sh->in_put.store(0);
    pid_t v = ForkChild([&] {
      close(fds[0]);
      return Victim(d, sid, m, sh, range, fds[1]);
    });
    close(fds[1]);
    ++spawned;
    char ready = 0;
    pollfd pfd{fds[0], POLLIN, 0};
    ssize_t n = 0;
    if (poll(&pfd, 1, 10000) == 1) n = read(fds[0], &ready, 1);  // 0: it died
    close(fds[0]);
    if (n != 1) ADD_FAILURE() << "a victim did not open the cache within 10 s";
    auto t0 = std::chrono::steady_clock::now();
    // The kill point: a random moment inside the victim's put loop.
    uint64_t delay = rng() % static_cast<uint64_t>(ema_us * 0.9 + 1);
    if (n == 1 && ready == 'R') {
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
    }
    bool was_in_put = sh->in_put.load() != 0;
    kill(v, SIGKILL);
    int st = 0;
    ASSERT_TRUE(WaitChild(v, &st, std::chrono::seconds(10)));
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
      ++kills;
      if (was_in_put) ++kills_in_put;
      if (range % 2 == 1) ++batch_kills;
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      ++completed;
      double took =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
              .count();
      ema_us = 0.8 * ema_us + 0.2 * took;
    } else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 4)) {
      ADD_FAILURE() << "victim ended with " << DescribeStatus(st) << ": " << sh->msg;
      victim_failed = true;
    }
  }
  sh->stop.store(true);
  for (pid_t p : others) {
    int st = 0;
    bool ended = WaitChild(p, &st, std::chrono::seconds(20));
    if (!ended) {
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
    }
    EXPECT_TRUE(ended) << "a reader or the steady writer hung";
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << DescribeStatus(st) << ": " << sh->msg;
  }
  EXPECT_EQ(sh->victim_full.load(), 0u) << "the budget was too small";

  // Every row of every range, read back once more.
  uint64_t final_verified = 0, final_missing = 0;
  Row row;
  for (uint64_t r = 0; r < sh->ranges.load(); ++r) {
    for (uint64_t i = 0; i < kRowsPerVictim; ++i) {
      uint64_t id = r * kRowsPerVictim + i;
      Status s = cache->Get(id, &row);
      if (s.IsNotFound()) {
        ++final_missing;
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
      std::string bad = m.Verify(id, row.view());
      ASSERT_EQ(bad, "") << "row " << id;
      ++final_verified;
    }
  }
  for (uint64_t i = 0; i < sh->steady_puts.load(); ++i) {
    Status s = cache->Get(kSteadyBase + i, &row);
    ASSERT_TRUE(s.ok()) << "steady row " << i << ": " << s.ToString();
    ASSERT_EQ(m.Verify(kSteadyBase + i, row.view()), "");
    ++final_verified;
  }

  // Space: the writers are gone and the daemon has recycled their chunk
  // tails. A clean filler uses every recyclable byte until the budget is
  // spent; what is neither a published row nor a segment header is lost.
  const uint64_t filler_bytes = 512;
  cache.reset();
  admin.reset();
  pid_t filler = ForkChild([&] {
    std::unique_ptr<Client> c;
    std::unique_ptr<Cache> fc;
    if (!Open(d, sid, &c, &fc).ok()) return 2;
    std::vector<uint8_t> data(filler_bytes - 128, 7);
    for (uint64_t i = 0;; ++i) {
      Status s = fc->Put((1ULL << 50) + i, data.data(), data.size());
      if (s.IsFull()) return 0;
      if (!s.ok()) return 3;
    }
  });
  int st = 0;
  ASSERT_TRUE(WaitChild(filler, &st, std::chrono::seconds(120)));
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << DescribeStatus(st);
  ASSERT_TRUE(Client::Connect(d.client_options(), &admin).ok());
  ASSERT_TRUE(Open(d, sid, &admin, &cache).ok());
  CacheStats after;
  ASSERT_TRUE(cache->GetStats(&after).ok());
  ASSERT_TRUE(after.full);
  const uint64_t header = (sizeof(layout::CacheHeader) + 4095) / 4096 * 4096;
  const uint64_t tables = TableBytes(d, cache->cache_id());
  uint64_t segs = 0;
  for (const std::string& f : d.ShmFiles()) {
    if (f.find(fmt::format("seg.{}.", cache->cache_id())) != std::string::npos) ++segs;
  }
  const uint64_t data_reserved = after.reserved_bytes - header - tables;
  const uint64_t lost =
      data_reserved - segs * layout::kSegmentHeaderSize - after.mem_bytes;
  const double per_kill = kills ? static_cast<double>(lost) / kills : 0;
  const uint64_t max_row = m.EncodedBytes(0) - m.DataBytes(0) + kMaxData + 8;
  // What ended writers may cost: a killed one the row it was writing (a
  // window of a batch: rows written before they are published); any one a
  // chunk tail too small to recycle and its chunk headers.
  const uint64_t lost_bound = (kills - batch_kills) * max_row +
                              batch_kills * kBatchWindow * max_row +
                              (kills + completed) * (kMinRecycle + uint64_t{4} * 64);

  fmt::print(
      "writer-kill figures: kills {} (inside Put {}, of a PutBatch {}), victims "
      "completed {}, "
      "reads verified {} (+{} in the final pass, {} ids never written), "
      "wrong reads {}, read errors {}, misses {}, steady-writer puts {} "
      "(errors {}); space: {} MB of rows in {} MB of segments, {} bytes not "
      "holding a row = {:.0f} bytes per killed writer (bound: {} bytes, one row "
      "of at most {} bytes per kill + a {} byte tail and chunk headers per "
      "ended writer)\n",
      kills, kills_in_put, batch_kills, completed, sh->reads_verified.load(),
      final_verified, final_missing, sh->wrong_reads.load(), sh->read_errors.load(),
      sh->misses.load(), sh->steady_puts.load(), sh->steady_errors.load(),
      after.mem_bytes >> 20, data_reserved >> 20, lost, per_kill, lost_bound, max_row,
      kMinRecycle);
  RecordProperty("kills", static_cast<int>(kills));
  RecordProperty("reads_verified", static_cast<int>(sh->reads_verified.load()));
  RecordProperty("bytes_lost_per_kill", static_cast<int>(per_kill));

  // What was verified, however fast this machine is: writers were killed
  // inside Put, every read was right, and the space lost is bounded by the
  // writers that ended. (How many kills fit in the run depends on the
  // machine; the counts are printed above.)
  EXPECT_GT(kills_in_put, 0u) << "no writer was killed inside Put: nothing was tested";
  EXPECT_GT(batch_kills, 0u) << "no writer was killed in a PutBatch";
  EXPECT_GT(sh->reads_verified.load(), 0u);
  EXPECT_EQ(sh->wrong_reads.load(), 0u) << sh->msg;
  EXPECT_EQ(sh->read_errors.load(), 0u) << sh->msg;
  EXPECT_EQ(sh->steady_errors.load(), 0u) << sh->msg;
  EXPECT_GT(sh->steady_puts.load(), 0u);
  EXPECT_LE(lost, lost_bound)
      << "killed writers cost more than the rows they were writing";
  EXPECT_TRUE(d.Stop().ok());
  EXPECT_TRUE(d.ShmFiles().empty());
}

// Writers killed in the middle of PutBatch: the rows a batch published
// before the kill are counted (mem_rows), all but at most one window of
// the batch (kBatchWindow rows: PutBatch counts once per window).
TEST(WriterKill, AWriterKilledInAPutBatchLeavesTheRowCountRight) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  SessionCache sc;
  ASSERT_TRUE(OpenSessionCache(d, "f", &sc).ok());
  constexpr uint64_t kBatch = 4096;
  constexpr int kKills = 5;
  std::mt19937_64 rng(std::random_device{}());
  for (int k = 0; k < kKills; ++k) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t v = ForkChild([&] {
      close(fds[0]);
      std::unique_ptr<Client> c;
      std::unique_ptr<Cache> cache;
      if (!Client::Connect(d.client_options(), &c).ok() ||
          !c->OpenCache({.session_id = sc.session, .fingerprint = "f"}, &cache).ok()) {
        return 2;
      }
      // Small rows: a batch is mostly publishing, not copying.
      std::vector<uint8_t> data(64, 1);
      ColumnRef col{"data", DType::kUInt8, {}, data.data(), data.size()};
      const int64_t shape[] = {64};
      col.shape = shape;
      std::vector<std::span<const ColumnRef>> rows(kBatch, std::span(&col, 1));
      std::vector<Status> st(kBatch);
      std::vector<uint64_t> ids(kBatch);
      for (uint64_t b = 0;; ++b) {
        for (uint64_t i = 0; i < kBatch; ++i) {
          ids[i] = (static_cast<uint64_t>(k) << 32) + b * kBatch + i;
        }
        if (!cache->PutBatch(ids, rows, st).ok() || !st.back().ok()) return 3;
        if (b == 0 && write(fds[1], "R", 1) != 1) return 4;
      }
    });
    close(fds[1]);
    char ready = 0;
    ASSERT_EQ(read(fds[0], &ready, 1), 1) << "the writer did not finish a batch";
    close(fds[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    kill(v, SIGKILL);
    int st = 0;
    ASSERT_TRUE(WaitChild(v, &st, std::chrono::seconds(10)));
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << DescribeStatus(st);
  }
  // Each writer published its ids in order: they end at its first miss.
  uint64_t present = 0;
  for (int k = 0; k < kKills; ++k) {
    for (uint64_t id = static_cast<uint64_t>(k) << 32;
         sc.cache->Contains(id) || sc.cache->Contains(id + 1); ++id) {
      if (sc.cache->Contains(id)) ++present;
    }
  }
  CacheStats stats;
  ASSERT_TRUE(sc.cache->GetStats(&stats).ok());
  EXPECT_GE(present, kKills * kBatch);
  EXPECT_LE(stats.mem_rows, present);
  EXPECT_GE(stats.mem_rows + kKills * kBatchWindow, present)
      << "rows the killed writers published are not counted";
}

}  // namespace
}  // namespace shmcache::test
