// Capacity: memory budgets, full caches, the server-wide cap and the
// memory readers of destroyed sessions still hold (spilling over a budget:
// spill_test.cc). Every test runs its own daemon.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "format/layout.h"
#include "format/shm_file.h"
#include "shmcache/client.h"
#include "tests/support/capacity_helpers.h"
#include "tests/support/child_process.h"
#include "tests/support/test_server.h"

namespace shmcache::test {
namespace {

// The library (a Cache's GetStats and IsFull) and the daemon (the
// listing) read every state of a cache alike: they share one reading.
TEST(CapacityTest, LibraryAndListingReadEveryCacheStateAlike) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = OpenCache(server, session, 1, false);
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  ShmFile file;
  ASSERT_TRUE(ShmFile::Open(server.shm_dir() + "/" + server.shm_prefix() + "cache." +
                                std::to_string(cache->cache_id()),
                            &file)
                  .ok());
  auto& state = reinterpret_cast<layout::CacheHeader*>(file.data())->state;
  const uint32_t original = state.load();
  using namespace layout;
  for (uint32_t bits :
       {0u, kStateFull, kStateSpillEnabled, kStateMemFull,
        kStateSpillEnabled | kStateMemFull, kStateFull | kStateSpillEnabled,
        kStateFull | kStateMemFull, kStateFull | kStateSpillEnabled | kStateMemFull}) {
    SCOPED_TRACE(bits);
    state.store(bits);
    CacheStats mine;
    ASSERT_TRUE(cache->GetStats(&mine).ok());
    std::vector<SessionInfo> sessions;
    ASSERT_TRUE(client->ListSessions(&sessions).ok());
    ASSERT_EQ(sessions.size(), 1u);
    ASSERT_EQ(sessions[0].caches.size(), 1u);
    const CacheStats& listed = sessions[0].caches[0];
    EXPECT_EQ(mine.full, listed.full);
    EXPECT_EQ(mine.spills_now, listed.spills_now);
    EXPECT_EQ(cache->IsFull(), listed.full);
    EXPECT_EQ(mine.reserved_bytes, listed.reserved_bytes);
  }
  state.store(original);
}

TEST(CapacityTest, FullCacheWithoutSpillingRejectsPutsAndKeepsRows) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = OpenCache(server, session, 1, false);
  const size_t rows = (20u << 20) / kRowBytes;
  size_t stored = PutRows(cache.get(), rows);
  EXPECT_GT(stored, 0u);
  EXPECT_LT(stored, rows);
  EXPECT_TRUE(cache->IsFull());
  std::vector<uint8_t> row(kRowBytes, 1);
  EXPECT_TRUE(cache->Put(rows + 1, row.data(), row.size()).IsFull());
  EXPECT_LE(SegmentBytes(server), 1u << 20);
  // Every row stored before the cache filled is still there, in any process.
  EXPECT_EQ(CheckRowsInChild(server, session, rows, false), static_cast<long>(stored));
  CommandResult list = server.Admin({"--list_sessions", "--json"});
  EXPECT_NE(list.out.find("\"full\": true"), std::string::npos) << list.out;
  CommandResult table = server.Admin({"--list_sessions"});
  EXPECT_NE(table.out.find("yes"), std::string::npos) << table.out;
}

TEST(CapacityTest, CachesTogetherNeverPassTheServerCap) {
  TestServer server(WithArgs({"--memory_cap_mb", "24"}));
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto a = OpenCache(server, session, 0, false, "a");
  auto b = OpenCache(server, session, 0, false, "b");
  const size_t rows = (40u << 20) / kRowBytes;
  size_t in_a = PutRows(a.get(), rows);
  size_t in_b = PutRows(b.get(), rows);
  EXPECT_GT(in_a, 0u);
  EXPECT_LT(in_a + in_b, rows);
  EXPECT_TRUE(a->IsFull() || b->IsFull());
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  ServerInfo info;
  ASSERT_TRUE(client->GetServerInfo(&info).ok());
  EXPECT_EQ(info.memory_cap_bytes, 24u << 20);
  EXPECT_LE(info.memory_used_bytes, info.memory_cap_bytes);
  uint64_t files = 0;
  for (const std::string& n : server.ShmFiles()) {
    struct stat st;
    if (stat((server.shm_dir() + "/" + n).c_str(), &st) == 0 &&
        n.find("sessions") == std::string::npos) {
      files += static_cast<uint64_t>(st.st_size);
    }
  }
  EXPECT_LE(files, 24u << 20);
  CommandResult info_out = server.Admin({"--server_info"});
  EXPECT_NE(info_out.out.find("of 24 MB"), std::string::npos) << info_out.out;
}

// The room a writer leased is not lost to another writer whose lease finds
// the budget used up: once a process (a DataLoader worker beside this one)
// had its lease refused, the cache was full, and this one went on filling
// its nearly empty chunk alone; now that lease takes the room this one
// holds unused (ahead of the full flag, which stops new leases), so the
// other fills the budget. This one's next row, which its chunk no longer
// holds, is refused Full without a lease, and so are its later rows (full
// stays full for a writer).
TEST(CapacityTest, AWritersUnusedRoomGoesToAnotherWriterBeforeTheCacheIsFull) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  const size_t alone =
      PutRows(OpenCache(server, server.NewSession(), 1, false).get(), 1000);
  uint32_t session = server.NewSession();
  auto cache = OpenCache(server, session, 1, false);
  ASSERT_TRUE(PutBytes(cache.get(), 0, kRowBytes).ok());  // leases this one's chunk
  pid_t kid = ForkChild([&]() -> int {
    Status s;
    for (uint64_t id = 1; s.ok() && id < 10000; ++id)
      s = PutBytes(cache.get(), id, kRowBytes);
    return s.IsFull() ? 0 : 1;  // its leases took the rest and found none left
  });
  ASSERT_EQ(WaitChild(kid), 0);
  ASSERT_TRUE(cache->IsFull());
  size_t cached = 0;
  for (uint64_t id = 0; id < 10000; ++id) cached += cache->Contains(id);
  EXPECT_GE(cached, alone * 99 / 100) << "one writer alone caches " << alone;
  Status s = PutBytes(cache.get(), 100000, kRowBytes);
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_EQ(s.message().find("server"), std::string::npos)
      << "the budget's, not the cap's";
  EXPECT_TRUE(PutBytes(cache.get(), 200000, 10).IsFull());
  EXPECT_TRUE(cache->Contains(0));
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_GE(st.puts_full, 1u);
}

// More writers than a small budget has chunks (DataLoader workers, 8 of them
// on 1 MB): the chunks of the first four took the budget, the others'
// leases found none left, and the first four ran out of rows with room
// unused (here 62% of what one process caches). Each writer puts its share
// of 1.25 times that, all holding chunks at once (each puts a first row,
// then all go on), and holds its chunk until every one is done, as workers
// do until the epoch ends. They cache at least 95% of what one process
// does (room taken back from a writer that stopped, or that leased before
// the others came; a chunk's last room under a row per writer is left),
// and every row reads back whole from another process.
TEST(CapacityTest, ManyWritersFillASmallBudgetAsOneDoes) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  const size_t alone =
      PutRows(OpenCache(server, server.NewSession(), 1, false).get(), 1000);
  ASSERT_GT(alone, 300u);  // 1 MB of 3 KB rows
  constexpr size_t kWriters = 8;
  const size_t rows = alone * 5 / 4;
  const uint32_t session = server.NewSession();
  // ready: a first row put; go: all may go on; done: all put; end: exit.
  int ready[2], go[2], done[2], end[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(done), 0);
  ASSERT_EQ(pipe(end), 0);
  std::vector<pid_t> writers;
  for (size_t k = 0; k < kWriters; ++k) {
    writers.push_back(ForkChild([&]() -> int {
      close(go[1]);
      close(end[1]);
      std::unique_ptr<Cache> cache = OpenCacheInChild(server, session, 1, false);
      if (cache == nullptr) return 4;
      char b = 0;
      for (size_t id = k; id < rows; id += kWriters) {
        Status s = PutBytes(cache.get(), id, kRowBytes);
        if (!s.ok() && !s.IsFull()) return 5;
        // Each write end is closed once written: a writer that failed
        // before ends the test's wait by ending.
        if (id == k && (write(ready[1], &b, 1) != 1 || close(ready[1]) != 0 ||
                        read(go[0], &b, 1) != 1)) {
          return 6;
        }
        if (s.IsFull()) break;
      }
      if (write(done[1], &b, 1) != 1 || close(done[1]) != 0) return 7;
      while (read(end[0], &b, 1) > 0) {
      }
      return 0;
    }));
  }
  for (int fd : {ready[1], go[0], done[1], end[0]}) close(fd);
  char b = 0;
  size_t got = 0;
  while (got < kWriters && read(ready[0], &b, 1) == 1) ++got;
  EXPECT_EQ(got, kWriters);
  const std::string all(kWriters, 'g');
  EXPECT_EQ(write(go[1], all.data(), all.size()), static_cast<ssize_t>(all.size()));
  close(go[1]);
  for (got = 0; got < kWriters && read(done[0], &b, 1) == 1;) ++got;
  EXPECT_EQ(got, kWriters);
  const long cached = CheckRowsInChild(server, session, rows, false);
  close(end[1]);
  for (pid_t pid : writers) EXPECT_EQ(WaitChild(pid), 0);
  for (int fd : {ready[0], done[0]}) close(fd);
  EXPECT_GE(cached, static_cast<long>(alone * 95 / 100))
      << "of " << rows << " rows; one process caches " << alone;
}

// A writer whose rows outgrew its chunk (a small row leased it, large
// rows filled it) and whose next lease found the budget used up made the
// cache full with room left in that chunk, under a large row but room for
// many small ones. It gave that room back when it closed, and nobody leased
// it again: the flag stopped every lease for the rest of the run, so a
// second writer's small rows were refused with 20 KB to 100 KB free (mixed
// row sizes: variable-length records, decoded images of several shapes).
// Room given back to a full cache makes it take rows again, until a lease
// finds none for its row.
TEST(CapacityTest, RoomGivenBackToAFullCacheTakesRowsThatFitIt) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  const uint32_t session = server.NewSession();
  constexpr size_t kLarge = 300 << 10, kSmall = 1 << 10;
  auto cache = OpenCache(server, session, 4, false);
  uint64_t id = 0;
  Status s;
  // Three quarters of the budget in large rows, then a small row leases a
  // chunk that large rows fill until none fits and the budget is used up.
  for (; id < 9 && s.ok(); ++id) s = PutBytes(cache.get(), id, kLarge);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(PutBytes(cache.get(), id++, kSmall).ok());
  for (; id < 100 && s.ok(); ++id) s = PutBytes(cache.get(), id, kLarge);
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  ASSERT_TRUE(cache->IsFull());
  cache.reset();  // gives its chunk back
  const uint64_t first = 1000;
  constexpr int kTries = 1000;  // more than 300 KB holds
  pid_t kid = ForkChild([&]() -> int {
    std::unique_ptr<Cache> c = OpenCacheInChild(server, session, 4, false);
    if (c == nullptr) return 3;
    for (int k = 0; k < kTries; ++k) {
      Status put = PutBytes(c.get(), first + static_cast<uint64_t>(k), kSmall);
      if (put.IsFull()) return 0;
      if (!put.ok()) return 4;
    }
    return 5;
  });
  ASSERT_EQ(WaitChild(kid), 0) << "the small rows end on Full";
  auto again = OpenCache(server, session, 4, false);
  int stored = 0;
  for (int k = 0; k < kTries; ++k)
    stored += again->Contains(first + static_cast<uint64_t>(k));
  // The room left is under a large row, and up to a page of it may go to a
  // chunk's rounding: at least 15 small rows.
  EXPECT_GE(stored, 15) << "small rows cached in the room given back";
  EXPECT_TRUE(again->IsFull()) << "full again once the room is used";
}

// A size over the cap gets the cap: the cache holds what can be had (the
// Python client says so once at open, naming the bound), rather than being
// refused and bypassed whole.
TEST(CapacityTest, CacheLargerThanTheCapGetsTheCap) {
  TestServer server(WithArgs({"--memory_cap_mb", "32"}));
  ASSERT_TRUE(server.ok());
  uint32_t session = server.NewSession();
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(CacheNamed(session, "big", 4096, false), &cache);
  ASSERT_TRUE(s.ok()) << s.ToString();
  CacheStats stats;
  ASSERT_TRUE(cache->GetStats(&stats).ok());
  EXPECT_EQ(stats.budget_bytes, uint64_t{32} << 20);
}

// A full cache's fix is "a larger size_mb": the next run opens the same
// cache (same session, same name) asking for more. That open raises the
// budget, and the cache takes rows again, keeping those it held; an open
// asking less (or 0, "whatever it has") keeps it. Before, every later open
// got the first one's budget, so the fix did nothing.
TEST(CapacityTest, AFullCacheOpenedWithALargerSizeTakesRowsAgain) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto first = OpenCache(server, session, 4, false);
  const size_t rows = (16u << 20) / kRowBytes;
  const size_t stored = PutRows(first.get(), rows);
  ASSERT_GT(stored, 0u);
  ASSERT_LT(stored, rows);
  ASSERT_TRUE(first->IsFull());

  auto larger = OpenCache(server, session, 8, false);
  CacheStats st;
  ASSERT_TRUE(larger->GetStats(&st).ok());
  EXPECT_EQ(st.budget_bytes, 8 * kMB);
  EXPECT_FALSE(larger->IsFull());
  EXPECT_FALSE(first->IsFull());  // every process sees it at once
  const size_t now = PutRows(larger.get(), rows);
  EXPECT_GT(now, stored + stored / 2) << "only " << now << " of " << rows;
  EXPECT_TRUE(larger->IsFull());
  EXPECT_EQ(CheckRowsInChild(server, session, now, false), static_cast<long>(now));

  for (uint64_t mb : {uint64_t{2}, uint64_t{0}}) {
    auto again = OpenCache(server, session, mb, false);
    ASSERT_TRUE(again->GetStats(&st).ok());
    EXPECT_EQ(st.budget_bytes, 8 * kMB) << mb;
    EXPECT_TRUE(again->IsFull()) << mb;
  }
}

// The size is in MB, shifted into bytes by the daemon: from 2^44 MB on, the
// bytes wrapped (2^44 + 1 MB opened a 1 MB cache). Issue 32, item 9.
TEST(CapacityTest, ASizeWhoseBytesDoNotFitIsRefused) {
  TestServer server(WithArgs({"--memory_cap_mb", "32"}));
  ASSERT_TRUE(server.ok());
  uint32_t session = server.NewSession();
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  const uint64_t kLargest = uint64_t{INT64_MAX} >> 20;  // bytes fit an off_t
  for (uint64_t mb :
       {kLargest + 1, uint64_t{1} << 44, (uint64_t{1} << 44) + 1, uint64_t{UINT64_MAX}}) {
    std::unique_ptr<Cache> cache;
    Status s = client->OpenCache(CacheNamed(session, "wraps", mb, false), &cache);
    EXPECT_TRUE(s.IsInvalidArgument()) << mb << ": " << s.ToString();
    EXPECT_NE(s.message().find(fmt::format("cache size {} MB is out of range", mb)),
              std::string::npos)
        << s.message();
  }
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(CacheNamed(session, "largest", kLargest, false), &cache);
  ASSERT_TRUE(s.ok()) << s.ToString();
  CacheStats stats;
  ASSERT_TRUE(cache->GetStats(&stats).ok());
  EXPECT_EQ(stats.budget_bytes, uint64_t{32} << 20);
}

// ---- Rows too large for the cache -----------------------------------------

// Puts one small row from a forked process; 0 when it was stored.
int PutSmallRowInChild(const TestServer& server, uint32_t session, uint64_t id,
                       bool spilling) {
  pid_t pid = ForkChild([&]() -> int {
    std::unique_ptr<Client> client;
    if (!server.Connect(&client).ok()) return 3;
    std::unique_ptr<Cache> cache;
    if (!client->OpenCache(CacheNamed(session, "capacity", 1, spilling), &cache).ok()) {
      return 4;
    }
    bool inserted = false;
    Status s = PutBytes(cache.get(), id, kRowBytes, &inserted);
    return s.ok() && inserted ? 0 : 5;
  });
  return WaitChild(pid);
}

TEST(CapacityTest, RowLargerThanTheBudgetIsRefusedAloneAndTheCacheGoesOn) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = OpenCache(server, session, 8, false);
  Status s = PutBytes(cache.get(), 1, 12 * kMB);
  ASSERT_TRUE(s.IsTooLarge()) << s.ToString();
  EXPECT_NE(s.message().find("12.0 MB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("8 MB"), std::string::npos) << s.message();
  EXPECT_FALSE(cache->IsFull());
  // Another process still caches its rows in memory.
  EXPECT_EQ(PutSmallRowInChild(server, session, 2, false), 0);
  EXPECT_TRUE(cache->Contains(2));
  EXPECT_FALSE(cache->Contains(1));
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, 1u);
  EXPECT_FALSE(st.full);
}

// Within the budget, but more than any room the cache can still give one
// row: the daemon refuses it, and only it (TooLarge, not Full: a full cache
// refuses every later row), naming the most one row can take and the fix.
// 16 MB: 8 MB are left for segments once the first two are made; 8 MB: all
// of its budget is in two 4 MB segments (the one leased from and the one
// made ahead). The most is 8 MB (4 MB) less a segment header and a chunk
// header: 8.0 (4.0) to a tenth.
TEST(CapacityTest, RowLargerThanWhatIsLeftIsRefusedAloneUntilTheCacheIsFull) {
  for (auto [size_mb, big_mb, most] : {std::tuple{16, 13, "8.0"}, {8, 5, "4.0"}}) {
    SCOPED_TRACE(fmt::format("{} MB row into {} MB", big_mb, size_mb));
    TestServer server;
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    uint32_t session = server.NewSession();
    auto cache = OpenCache(server, session, size_mb, false);
    ASSERT_TRUE(PutBytes(cache.get(), 0, kRowBytes).ok());
    Status s = PutBytes(cache.get(), 1, big_mb * kMB);
    ASSERT_TRUE(s.IsTooLarge()) << s.ToString();
    for (const std::string& said :
         {fmt::format("a row of {}.0 MB", big_mb),
          fmt::format("budget of {} MB", size_mb),
          fmt::format("the most one row can take in it now is {} MB", most),
          std::string("a larger size_mb")}) {
      EXPECT_NE(s.message().find(said), std::string::npos) << said << ": " << s.message();
    }
    EXPECT_FALSE(cache->IsFull());
    // Smaller rows, from this process and another, still go in.
    ASSERT_TRUE(PutBytes(cache.get(), 2, kRowBytes).ok());
    EXPECT_EQ(PutSmallRowInChild(server, session, 3, false), 0);
    EXPECT_FALSE(cache->Contains(1));
    // Small rows then use up the budget: that cache is full, as ever.
    const size_t rows = (24u << 20) / kRowBytes;
    size_t stored = PutRows(cache.get(), rows);
    EXPECT_GT(stored, (static_cast<size_t>(size_mb) << 19) / kRowBytes);
    EXPECT_LT(stored, rows);
    EXPECT_TRUE(cache->IsFull());
  }
}

// Near the end of a cache's memory the most one row can take is small: the
// TooLarge message says it in KB (once "0.0 MB", which reads as "nothing";
// a figure is what tells the user which rows still fit), and never as the
// refused row's own size (once "a row of 1.0 MB does not fit: the most one
// row can take is 1.0 MB"). A 1 MB row is tried after each small row,
// until the cache is full.
TEST(CapacityTest, TheMostOneRowCanTakeIsSaidInKBWhenItIsUnderAMegabyte) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  auto cache = OpenCache(server, server.NewSession(), 8, false);
  std::vector<std::string> small;  // the messages naming less than 1 MB
  for (uint64_t id = 0; id < 8 * kMB / kRowBytes && !cache->IsFull(); ++id) {
    if (!PutBytes(cache.get(), 2 * id, kRowBytes).ok()) break;
    Status s = PutBytes(cache.get(), 2 * id + 1, kMB);
    if (!s.IsTooLarge()) continue;
    EXPECT_EQ(s.message().find(" 0.0 MB"), std::string::npos) << s.message();
    std::smatch m;
    const std::string& msg = s.message();
    // Never "a row of 1.0 MB does not fit ...: the most ... is 1.0 MB".
    static const std::regex kBoth("a row of (.+) does not fit .* now is (.+) \\(its");
    ASSERT_TRUE(std::regex_search(msg, m, kBoth)) << msg;
    EXPECT_NE(m[1].str(), m[2].str()) << msg;
    static const std::regex kMost("the most one row can take in it now is ([0-9]+) KB");
    if (std::regex_search(msg, m, kMost)) small.push_back(msg);
  }
  EXPECT_FALSE(small.empty()) << "no TooLarge named less than 1 MB before the cache "
                                 "was full";
}

// The other side: a cache of large rows is full once a row of their size no
// longer fits (not TooLarge for each of them, which would keep the cache
// asking the daemon for room on every put). 8 MB: a 5 MB row takes a 6 MB
// segment, and 2 MB are left.
TEST(CapacityTest, ACacheOfLargeRowsIsFullOnceNoneFits) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = OpenCache(server, session, 8, false);
  ASSERT_TRUE(PutBytes(cache.get(), 0, 5 * kMB).ok());
  Status s = PutBytes(cache.get(), 1, 5 * kMB);
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_TRUE(cache->IsFull());
}

// ---- Memory of destroyed sessions that readers still map ------------------

ServerInfo GetInfo(const TestServer& server) {
  std::unique_ptr<Client> client;
  ServerInfo info;
  Status s = server.Connect(&client);
  if (s.ok()) s = client->GetServerInfo(&info);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return info;
}

// A forked reader of rows 0..n-1 of cache "capacity" that then keeps the
// cache mapped until it is killed. Returns its pid once it read them all,
// or -1.
pid_t StartReader(const TestServer& server, uint32_t session, size_t n) {
  int ready[2], hold[2];
  if (pipe(ready) != 0 || pipe(hold) != 0) return -1;
  pid_t pid = ForkChild([&]() -> int {
    close(ready[0]);
    close(hold[1]);
    std::unique_ptr<Client> client;
    if (!server.Connect(&client).ok()) return 3;
    std::unique_ptr<Cache> cache;
    if (!client->OpenCache(CacheNamed(session, "capacity", 1, false), &cache).ok()) {
      return 4;
    }
    Row row;
    size_t found = 0;
    for (size_t i = 0; i < n; ++i) found += cache->Get(i, &row).ok();
    if (write(ready[1], &found, sizeof found) != sizeof found) return 5;
    char c;
    return read(hold[0], &c, 1) == 0 ? 0 : 6;  // blocks until killed
  });
  close(ready[1]);
  close(hold[0]);
  size_t found = 0;
  bool ok = read(ready[0], &found, sizeof found) == sizeof found && found == n;
  close(ready[0]);
  EXPECT_EQ(found, n);
  if (!ok) {
    kill(pid, SIGKILL);
    WaitChild(pid);
    return -1;
  }
  return pid;
}

TEST(CapacityTest, DestroyedSessionMappedByAReaderStaysCountedUntilItUnmaps) {
  TestServer server(WithArgs({"--memory_cap_mb", "64"}));
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  const uint64_t cap = 64 * kMB;
  const size_t rows = (64u << 20) / kRowBytes;
  uint32_t a = server.NewSession();
  size_t in_a = 0;
  uint64_t a_bytes = 0;
  {
    auto cache = OpenCache(server, a, 40, false);
    in_a = PutRows(cache.get(), rows);
    ASSERT_TRUE(cache->IsFull());
    CacheStats st;
    ASSERT_TRUE(cache->GetStats(&st).ok());
    a_bytes = st.reserved_bytes;
  }  // this process maps nothing of A any more
  pid_t reader = StartReader(server, a, in_a);
  ASSERT_GT(reader, 0);
  CommandResult d = server.Admin({"-d", std::to_string(a)});
  ASSERT_EQ(d.exit_code, 0) << d.Describe();

  // Everything of A is mapped by the reader: all of it stays counted.
  ServerInfo info = GetInfo(server);
  EXPECT_EQ(info.memory_held_bytes, a_bytes);
  EXPECT_GE(info.memory_used_bytes, a_bytes);
  CommandResult table = server.Admin({"--server_info"});
  EXPECT_NE(table.out.find(fmt::format("({:.1f} MB held by readers of dropped sessions)",
                                       static_cast<double>(a_bytes) / kMB)),
            std::string::npos)
      << table.out;
  CommandResult json = server.Admin({"--server_info", "--json"});
  EXPECT_NE(json.out.find(fmt::format("\"memory_held_bytes\": {}", a_bytes)),
            std::string::npos)
      << json.out;

  // B gets only what A does not still occupy: no over-commit.
  uint32_t b = server.NewSession();
  auto cache_b = OpenCache(server, b, 0, false);
  size_t in_b = PutRows(cache_b.get(), rows);
  EXPECT_GT(in_b, 0u);
  EXPECT_TRUE(cache_b->IsFull());
  CacheStats st;
  ASSERT_TRUE(cache_b->GetStats(&st).ok());
  EXPECT_LE(st.reserved_bytes + a_bytes, cap)
      << "B " << st.reserved_bytes << " + A's held " << a_bytes;
  EXPECT_LE(GetInfo(server).memory_used_bytes, cap);

  // Once the reader is gone, A's memory is free and B grows again.
  ASSERT_EQ(kill(reader, SIGKILL), 0);
  EXPECT_EQ(WaitChild(reader), -SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return GetInfo(server).memory_held_bytes == 0; }));
  EXPECT_FALSE(cache_b->IsFull());
  std::vector<uint8_t> row(kRowBytes);
  size_t more = 0;
  for (size_t i = rows; i < 2 * rows; ++i) {
    if (!cache_b->Put(i, row.data(), row.size()).ok()) break;
    ++more;
  }
  EXPECT_GT(more * kRowBytes, 16 * kMB) << "B took over A's memory";
  info = GetInfo(server);
  EXPECT_LE(info.memory_used_bytes, cap);
  EXPECT_EQ(info.memory_held_bytes, 0u);
}

}  // namespace
}  // namespace shmcache::test
