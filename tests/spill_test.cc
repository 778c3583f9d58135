// Spilling (spill_store.h, cache_spiller.cc, spill_reader.h): rows over a
// cache's memory budget go to RocksDB in the spill dir and read back whole,
// in this process and others; what cannot spill is refused alone. Every
// test runs its own daemon.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/instance.h"
#include "format/protocol.h"
#include "format/row_codec.h"
#include "lib/spill_reader.h"
#include "shmcache/client.h"
#include "shmcache/stats.h"
#include "tests/support/capacity_helpers.h"
#include "tests/support/child_process.h"
#include "tests/support/spilling_cache_test.h"
#include "tests/support/test_server.h"
#include "tests/support/tmpfs_mount.h"

namespace shmcache::test {
namespace {

// The spilling tests that begin as most do: a spill dir, a daemon, a session and a 1 MB
// spilling cache of their own (spilling_cache_test.h).
using SpillTest = SpillingCacheTest;

// Bytes under `dir`, recursively: the files' sizes (`apparent`) or the
// blocks they have on disk, which include what RocksDB preallocated past
// a file's end (fallocate with FALLOC_FL_KEEP_SIZE).
uint64_t DiskUsage(const std::string& dir, bool apparent = false) {
  uint64_t total = 0;
  for (const std::string& n : ListDir(dir)) {
    const std::string p = std::string(dir).append("/").append(n);
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      total += DiskUsage(p, apparent);
    } else {
      total += apparent ? static_cast<uint64_t>(st.st_size)
                        : static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return total;
}

// What RocksDB keeps allocated in a database that holds no rows: its live
// write-ahead log is preallocated by 1.1 memtables on its first write
// (16 MB ones at most: SpillStore::kRoomyMemtables), its manifest by 4 MB
// (DBOptions::manifest_preallocation_size); a block of slack per file.
constexpr uint64_t kEmptyDatabaseReserve =
    (16u << 20) * 11 / 10 + (4u << 20) + (64u << 10);

// Files under `dir` that this process holds open or mapped, as
// /proc/self/fd and /proc/self/maps name them: those deleted meanwhile only
// when `deleted`.
std::vector<std::string> FilesHeld(const std::string& dir, bool deleted) {
  std::vector<std::string> held;
  auto counts = [&](const std::string& target) {
    return target.rfind(dir + "/", 0) == 0 &&
           (!deleted || target.ends_with(" (deleted)"));
  };
  for (const std::string& fd : ListDir("/proc/self/fd")) {
    char target[4096];
    ssize_t n = readlink(("/proc/self/fd/" + fd).c_str(), target, sizeof target - 1);
    if (n > 0 && counts(std::string(target, static_cast<size_t>(n)))) {
      held.push_back("fd " + fd + ": " + std::string(target, static_cast<size_t>(n)));
    }
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    size_t path = line.find('/');
    if (path != std::string::npos && counts(line.substr(path))) {
      held.push_back("mapped: " + line);
    }
  }
  return held;
}

// Encoded bytes of the row Cache::Put(id, data, n) makes.
size_t EncodedBytes(size_t n) {
  int64_t shape[1] = {static_cast<int64_t>(n)};
  ColumnRef col{"data", DType::kUInt8, shape, shape, n};  // data never read
  size_t size = 0;
  EXPECT_TRUE(RowCodec::EncodedSize(std::span(&col, 1), &size).ok());
  return size;
}

// The largest payload whose row encodes to at most `limit` bytes.
size_t PayloadFor(size_t limit) {
  size_t n = limit - (EncodedBytes(0));
  while (EncodedBytes(n) > limit) --n;
  return n;
}

bool SameData(const Row& row, const std::vector<uint8_t>& want) {
  auto col = row.find("data");
  return col && col->nbytes == want.size() &&
         std::memcmp(col->data, want.data(), want.size()) == 0;
}

TEST_F(SpillTest, SpilledRowsUpToTheLimitReadBackWhole) {
  // 8 MB and the largest row that may spill go to disk (each is more
  // than the 1 MB budget); a small row after them still fits memory.
  const size_t largest = PayloadFor(protocol::kMaxSpilledRowBytes);
  ASSERT_EQ(EncodedBytes(largest), protocol::kMaxSpilledRowBytes);
  const std::vector<std::vector<uint8_t>> rows = {
      Pattern(0, 1, 8u << 20), Pattern(1, 1, largest), Pattern(2, 1, kRowBytes)};
  for (uint64_t id = 0; id < rows.size(); ++id) {
    bool inserted = false;
    Status s = cache_->Put(id, rows[id].data(), rows[id].size(), &inserted);
    ASSERT_TRUE(s.ok() && inserted) << id << ": " << s.ToString();
  }
  CacheStats st;
  ASSERT_TRUE(cache_->GetStats(&st).ok());
  EXPECT_EQ(st.disk_rows, 2u);
  EXPECT_EQ(st.mem_rows, 1u);
  for (uint64_t id = 0; id < rows.size(); ++id) {
    Row got;
    Status s = cache_->Get(id, &got);
    ASSERT_TRUE(s.ok()) << id << ": " << s.ToString();
    EXPECT_TRUE(SameData(got, rows[id])) << id;
    RowView view;
    s = cache_->View(id, &view);
    ASSERT_TRUE(s.ok()) << id << ": " << s.ToString();
    auto col = view.find("data");
    ASSERT_TRUE(col.has_value());
    EXPECT_EQ(col->nbytes, rows[id].size());
  }
  // Two large rows never fit one response: each comes in its own.
  const std::vector<uint64_t> ids = {0, 1, 2, 0};
  std::vector<Row> got(ids.size());
  std::vector<Status> statuses(ids.size());
  ASSERT_TRUE(cache_->GetBatch(ids, got, statuses).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
    EXPECT_TRUE(SameData(got[i], rows[ids[i]])) << i;
  }
}

TEST(CapacityTest, RowTooLargeToSpillIsRefusedAndTheConnectionStays) {
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
  {
    TestServer server(WithArgs({"-s", spill}));
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    std::unique_ptr<Client> client;
    ASSERT_TRUE(server.Connect(&client).ok());
    uint32_t session = 0;
    ASSERT_TRUE(client->CreateSession(&session).ok());
    std::unique_ptr<Cache> cache;
    ASSERT_TRUE(client->OpenCache(CacheNamed(session, "big", 1, true), &cache).ok());
    std::vector<uint8_t> huge(70u << 20, 7);
    Status s = cache->Put(1, huge.data(), huge.size());
    EXPECT_EQ(s.code(), Status::Code::kTooLarge) << s.ToString();
    EXPECT_NE(s.message().find("(70.0 MB)"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("(64.0 MB)"), std::string::npos) << s.message();
    EXPECT_FALSE(cache->Contains(1));
    // One byte past the limit is refused too.
    huge.resize(PayloadFor(protocol::kMaxSpilledRowBytes) + 1);
    s = cache->Put(2, huge.data(), huge.size());
    EXPECT_EQ(s.code(), Status::Code::kTooLarge) << s.ToString();
    // The same client goes on: its connection was never cut.
    std::vector<uint8_t> row = Pattern(3, 1, kRowBytes);
    bool inserted = false;
    s = cache->Put(3, row.data(), row.size(), &inserted);
    EXPECT_TRUE(s.ok() && inserted) << s.ToString();
    Row got;
    ASSERT_TRUE(cache->Get(3, &got).ok());
    EXPECT_TRUE(SameData(got, row));
    uint32_t another = 0;
    EXPECT_TRUE(client->CreateSession(&another).ok());
    std::string log = server.ReadLog();
    EXPECT_EQ(log.find("frame too large"), std::string::npos) << log;
  }
}

// A spilled row waits on the daemon's disk: a server slower than the
// request timeout (here: stopped for three of them) is waited for, up to the
// disk timeout, rather than taken for gone.
TEST(CapacityTest, ASlowSpillDiskIsNotTakenForADeadServer) {
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
  {
    TestServer server(WithArgs({"-s", spill}));
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    ClientOptions options = server.client_options();
    options.request_timeout_ms = 200;
    std::unique_ptr<Client> client;
    ASSERT_TRUE(Client::Connect(options, &client).ok());
    uint32_t session = 0;
    ASSERT_TRUE(client->CreateSession(&session).ok());
    std::unique_ptr<Cache> cache;
    ASSERT_TRUE(client->OpenCache(CacheNamed(session, "slow", 1, true), &cache).ok());
    std::vector<uint8_t> row = Pattern(1, 1, 2u << 20);  // over the budget: spills
    ASSERT_TRUE(cache->Put(1, row.data(), row.size()).ok());
    const ContinuedAfter continued(server.pid());  // however the test ends
    ASSERT_TRUE(StopProcess(server.pid()));
    pid_t waker = ForkChild([&] {
      usleep(3 * 200 * 1000);  // the slowness under test, not a wait for a condition
      return kill(server.pid(), SIGCONT) == 0 ? 0 : 1;
    });
    Row got;
    Status s = cache->Get(1, &got);
    EXPECT_EQ(WaitChild(waker), 0);
    kill(server.pid(), SIGCONT);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(SameData(got, row));
    // A request that does not wait on disk keeps the short timeout.
    ASSERT_TRUE(StopProcess(server.pid()));
    uint32_t another = 0;
    s = client->CreateSession(&another);
    kill(server.pid(), SIGCONT);
    EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  }
}

TEST_F(SpillTest, SpillingKeepsMemoryWithinBudgetAndServesEveryRow) {
  const size_t rows = (20u << 20) / kRowBytes;  // 20 MB of rows
  EXPECT_EQ(PutRows(cache_.get(), rows), rows);
  CacheStats st;
  ASSERT_TRUE(cache_->GetStats(&st).ok());
  EXPECT_GT(st.disk_rows, 0u);
  EXPECT_EQ(st.mem_rows + st.disk_rows, rows);
  EXPECT_TRUE(st.spills_now);
  EXPECT_FALSE(st.full);
  // Rows live in segments; those stay within the 1 MB budget. The header
  // and index tables are the documented per-cache overhead.
  EXPECT_LE(SegmentBytes(server_), 1u << 20);
  EXPECT_EQ(CheckRowsInChild(server_, session_, rows, true), static_cast<long>(rows));
  // The same rows through the batched read.
  std::vector<uint64_t> ids(rows);
  for (size_t i = 0; i < rows; ++i) ids[i] = i;
  std::vector<Row> out(rows);
  std::vector<Status> statuses(rows);
  ASSERT_TRUE(cache_->GetBatch(ids, out, statuses).ok());
  for (size_t i = 0; i < rows; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
    auto col = out[i].find("data");
    ASSERT_TRUE(col.has_value());
    ASSERT_EQ(0, std::memcmp(col->data, Pattern(i, 7, kRowBytes).data(), kRowBytes));
  }
  CommandResult list = server_.Admin({"--list_sessions", "--json"});
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_NE(list.out.find("\"disk_cached\": " + std::to_string(st.disk_rows)),
            std::string::npos)
      << list.out;
}

// A spilled row has no shared memory: View says so (in_shared_memory() is
// false), ViewBatch answers IsNotSupported() with an empty view, and a
// projection naming a column it lacks is ColumnNotFound, as in memory.
TEST_F(SpillTest, SpilledRowsViewsAndMissingColumns) {
  const size_t rows = (2u << 20) / kRowBytes;  // twice the budget
  ASSERT_EQ(PutRows(cache_.get(), rows), rows);
  const uint64_t last = rows - 1;  // put once memory was used up: on disk
  RowView view;
  ASSERT_TRUE(cache_->View(last, &view).ok());
  EXPECT_FALSE(view.in_shared_memory());
  ASSERT_TRUE(cache_->View(0, &view).ok());
  EXPECT_TRUE(view.in_shared_memory());
  const uint64_t ids[] = {0, last};
  RowView views[2];
  Status statuses[2];
  ASSERT_TRUE(cache_->ViewBatch(ids, views, statuses).ok());
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].ToString();
  EXPECT_TRUE(statuses[1].IsNotSupported()) << statuses[1].ToString();
  EXPECT_TRUE(views[1].empty());
  std::string_view data[] = {"data"}, absent[] = {"mask"};
  Row row;
  ASSERT_TRUE(cache_->Get(last, data, &row).ok());
  Status s = cache_->Get(last, absent, &row);
  EXPECT_TRUE(s.IsColumnNotFound()) << s.ToString();
  EXPECT_EQ(row.num_columns(), 0u);
  s = cache_->Get(rows, data, &row);
  EXPECT_TRUE(s.IsNotFound() && !s.IsColumnNotFound()) << s.ToString();
  // A spilled row read uncounted: read whole, the counters unchanged.
  CacheStats before, after;
  ASSERT_TRUE(cache_->GetStats(&before).ok());
  Row got[2];
  ASSERT_TRUE(cache_->GetBatchUncounted(ids, got, statuses).ok());
  EXPECT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[1].ToString();
  EXPECT_EQ(got[1].column(0).nbytes, kRowBytes);
  ASSERT_TRUE(cache_->GetStats(&after).ok());
  EXPECT_EQ(after.hits, before.hits);
  EXPECT_EQ(after.misses, before.misses);
}

// "Open the cache with spilling=True" is the other fix a full cache's
// warning names: the next run's open of the same cache asks for it, and
// rows past the budget go to disk, the rows in memory kept. Before, the
// cache kept spilling off and the next run was refused every new row.
TEST_F(SpillTest, AFullCacheOpenedWithSpillingSpillsFromThen) {
  auto plain = OpenCache(server_, session_, 1, false, "plain");
  const size_t rows = (3u << 20) / kRowBytes;
  const size_t stored = PutRows(plain.get(), rows);
  ASSERT_GT(stored, 0u);
  ASSERT_LT(stored, rows);
  ASSERT_TRUE(plain->IsFull());

  auto spilling = OpenCache(server_, session_, 1, true, "plain");
  EXPECT_FALSE(spilling->IsFull());
  EXPECT_EQ(PutRows(spilling.get(), rows), rows);
  CacheStats st;
  ASSERT_TRUE(spilling->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, stored);
  EXPECT_EQ(st.disk_rows, rows - stored);
  EXPECT_TRUE(st.spills_now);
  EXPECT_FALSE(st.full);
  EXPECT_EQ(CheckRowsInChild(server_, session_, rows, true, 7, "plain"),
            static_cast<long>(rows));
}

// The daemon's listing reads "spilling" as a cache's own GetStats does.
TEST_F(SpillTest, ListingReportsWhetherACacheSpillsNow) {
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server_.Connect(&client).ok());
  auto listed_spilling = [&] {
    std::vector<SessionInfo> sessions;
    EXPECT_TRUE(client->ListSessions(&sessions).ok());
    EXPECT_EQ(sessions.size(), 1u);
    EXPECT_EQ(sessions.empty() ? 0u : sessions[0].caches.size(), 1u);
    return !sessions.empty() && !sessions[0].caches.empty() &&
           sessions[0].caches[0].spills_now;
  };
  EXPECT_EQ(PutRows(cache_.get(), 1), 1u);
  EXPECT_FALSE(listed_spilling());             // within its budget: rows in memory
  const size_t rows = (4u << 20) / kRowBytes;  // 4 MB into a 1 MB budget
  EXPECT_EQ(PutRows(cache_.get(), rows), rows);
  CacheStats st;
  ASSERT_TRUE(cache_->GetStats(&st).ok());
  ASSERT_TRUE(st.spills_now);
  EXPECT_TRUE(listed_spilling());
}

TEST(CapacityTest, SpillingWithoutSpillDirNamesTheFix) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  uint32_t session = server.NewSession();
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(CacheNamed(session, "c", 0, true), &cache);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  // The command names the server's port, as every suggested command does.
  EXPECT_NE(s.message().find("shmcache --start -p " + std::to_string(server.port()) +
                             " -s DIR"),
            std::string::npos)
      << s.message();
}

// The fixture's spill dir was made empty, before the daemon started. `-d`
// returns once the session's rows are compacted away; RocksDB deletes the
// files that made obsolete (and the log the flush retired) from its own
// threads, which a loaded machine runs late. The rows' bytes are what
// goes; what stays allocated is the empty database's reserve
// (kEmptyDatabaseReserve). Counted in blocks, the disk use after -d was
// 22.7 MB every time (a new log preallocated for one flush marker, and
// the manifest), and half of "before" only when before was measured while
// the first log, retired by the first flush, was still there: the test
// failed 5 times in 20, loaded or not.
TEST_F(SpillTest, DestroyReturnsDiskSpaceAndStopLeavesSpillDirAsFound) {
  const size_t rows = (24u << 20) / kRowBytes;
  EXPECT_EQ(PutRows(cache_.get(), rows), rows);
  uint64_t before = 0;
  EXPECT_TRUE(WaitFor([&] { return (before = DiskUsage(spill_, true)) > (16u << 20); }));
  cache_.reset();
  CommandResult d = server_.Admin({"-d", std::to_string(session_)});
  ASSERT_EQ(d.exit_code, 0) << d.Describe();
  uint64_t after = 0;
  EXPECT_TRUE(WaitFor([&] { return (after = DiskUsage(spill_, true)) < before / 16; }))
      << "before " << before << " after " << after;
  const uint64_t allocated = DiskUsage(spill_);
  EXPECT_LE(allocated, after + kEmptyDatabaseReserve)
      << "allocated " << allocated << ", files' sizes " << after;
  CommandResult stop = server_.Stop();
  EXPECT_EQ(stop.exit_code, 0) << stop.Describe();
  EXPECT_TRUE(ListDir(spill_).empty()) << testing::PrintToString(ListDir(spill_));
}

// A process that read spilled rows held every table file its reader had
// open (each mapped, and the log it replayed) for as long as it lived: a
// cache closed and destroyed kept its rows' disk space taken. Its reader
// now closes with the last cache that read through it.
TEST_F(SpillTest, AClosedCachesReaderHoldsNoFileItsDestroyDeleted) {
  const size_t rows = (8u << 20) / kRowBytes;  // 8 times the budget
  ASSERT_EQ(PutRows(cache_.get(), rows), rows);
  for (uint64_t id = 0; id < rows; ++id) {
    Row row;
    ASSERT_TRUE(cache_->Get(id, &row).ok()) << id;
  }
  CacheStats st;
  ASSERT_TRUE(cache_->GetStats(&st).ok());
  EXPECT_GT(st.spill_reads, 0u);
  EXPECT_FALSE(FilesHeld(spill_, false).empty()) << "the reader has the database open";
  cache_.reset();
  CommandResult d = server_.Admin({"-d", std::to_string(session_)});
  ASSERT_EQ(d.exit_code, 0) << d.Describe();
  std::vector<std::string> held;
  EXPECT_TRUE(WaitFor([&] { return (held = FilesHeld(spill_, true)).empty(); }))
      << testing::PrintToString(held);
}

// A read that runs on after its cache closed (Close on another thread, as
// the read began) claims no reader and keeps none open: nothing would
// close it, and it held the database's files for the process's life.
TEST_F(SpillTest, AReadAfterItsCachesCloseKeepsNoReaderOpen) {
  const size_t rows = (8u << 20) / kRowBytes;  // 8 times the budget
  ASSERT_EQ(PutRows(cache_.get(), rows), rows);
  const InstancePaths paths =
      MakeInstancePaths(server_.port(), server_.run_dir(), server_.shm_dir());
  SpillReader::Use use;
  use.Drop();  // what the cache's Close does
  const std::weak_ptr<SpillReader> served = SpillReader::ForInstance(paths, &use);
  EXPECT_TRUE(served.expired()) << "the registry kept the reader of a closed cache";
  EXPECT_TRUE(FilesHeld(spill_, false).empty())
      << testing::PrintToString(FilesHeld(spill_, false));
}

// A claim made before fork() counts for nothing in the child: a cache the
// child inherited gives up its claim (its next spilled read claims anew,
// its Close) without taking away the child's own claims, whose reader
// stays open; the parent's reader is not the child's to close.
TEST_F(SpillTest, AClaimMadeBeforeForkCountsNothingInTheChild) {
  const size_t rows = (8u << 20) / kRowBytes;  // 8 times the budget
  ASSERT_EQ(PutRows(cache_.get(), rows), rows);
  const uint64_t spilled = rows - 1;  // memory took the first rows
  Row row;
  ASSERT_TRUE(cache_->Get(spilled, &row).ok());  // the parent's claim
  const InstancePaths paths =
      MakeInstancePaths(server_.port(), server_.run_dir(), server_.shm_dir());
  const pid_t child = ForkChild([&]() -> int {
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> own;
    if (!server_.Connect(&client).ok() ||
        !client->OpenCache(CacheNamed(session_, "capacity", 1, true), &own).ok()) {
      return 3;
    }
    Row got;
    if (!own->Get(spilled, &got).ok()) return 4;  // the child's own claim
    const std::shared_ptr<SpillReader> reader = SpillReader::ForInstance(paths);
    if (!reader) return 5;
    if (!cache_->Get(spilled, &got).ok()) return 6;  // the inherited one claims anew
    cache_->Close();
    return SpillReader::ForInstance(paths) == reader ? 0 : 7;  // 7: closed under `own`
  });
  ASSERT_GT(child, 0);
  EXPECT_EQ(WaitChild(child), 0);
  EXPECT_TRUE(cache_->Get(spilled, &row).ok());
}

// A process that goes on reading spilled rows of another cache lets go of
// the destroyed cache's files at its next spilled read once its view is a
// second old (SpillReader::kRefreshIntervalMs).
TEST_F(SpillTest, AReaderStillInUseLetsGoOfADestroyedCachesFilesAtItsNextRead) {
  const size_t rows = (8u << 20) / kRowBytes;
  uint32_t other_session = server_.NewSession();
  auto other = OpenCache(server_, other_session, 1, true, "other");
  ASSERT_EQ(PutRows(other.get(), rows), rows);
  ASSERT_EQ(PutRows(cache_.get(), rows), rows);
  for (uint64_t id = 0; id < rows; ++id) {
    Row row;
    ASSERT_TRUE(cache_->Get(id, &row).ok()) << id;
    ASSERT_TRUE(other->Get(id, &row).ok()) << id;
  }
  cache_.reset();
  CommandResult d = server_.Admin({"-d", std::to_string(session_)});
  ASSERT_EQ(d.exit_code, 0) << d.Describe();
  std::vector<std::string> held;
  EXPECT_TRUE(WaitFor([&] {
    Row row;
    EXPECT_TRUE(other->Get(rows - 1, &row).ok());
    return (held = FilesHeld(spill_, true)).empty();
  })) << testing::PrintToString(held);
  CacheStats st;
  ASSERT_TRUE(other->GetStats(&st).ok());
  EXPECT_GT(st.spill_reads, 0u);
}

TEST(CapacityTest, FullSpillDiskStopsSpillingButTrainingGoesOn) {
  TmpfsMount spill("32m");
  if (!spill.mounted()) GTEST_SKIP() << spill.skip_reason();
  {
    TestServer server(WithArgs({"-s", spill.path()}));
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    uint32_t session = server.NewSession();
    auto cache = OpenCache(server, session, 1, true);
    const size_t rows = (64u << 20) / kRowBytes;  // far more than 1 MB + 32 MB
    size_t stored = PutRows(cache.get(), rows);   // fails the test on any non-Full error
    EXPECT_GT(stored, 0u);
    EXPECT_LT(stored, rows);
    EXPECT_TRUE(cache->IsFull());
    // Reads keep working and return exactly what was stored.
    EXPECT_EQ(CheckRowsInChild(server, session, rows, true), static_cast<long>(stored));
    std::vector<uint8_t> row(kRowBytes);
    EXPECT_TRUE(cache->Put(rows + 5, row.data(), row.size()).IsFull());
  }
}

// A spill dir removed under the server (rm -rf of a scratch dir) used to
// read "spill disk full: 0 MB free": a failed statvfs counted as no room.
// The put, the warning built from it and the log now name the cause, and
// spilling stops; rows in memory stay. Issue 32, item 10.
TEST_F(SpillTest, ARemovedSpillDirIsNamedAsSuchAndSpillingStops) {
  const size_t rows = (2u << 20) / kRowBytes;
  EXPECT_EQ(PutRows(cache_.get(), rows), rows);
  CacheStats st;
  ASSERT_TRUE(cache_->GetStats(&st).ok());
  ASSERT_GT(st.disk_rows, 0u);
  RemoveTree(spill_);
  // The first put told the cause; the cache is full from then on.
  Status s = PutBytes(cache_.get(), rows, kRowBytes);
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_NE(s.message().find("was removed while this server used it"), std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("disk full"), std::string::npos) << s.message();
  EXPECT_TRUE(PutBytes(cache_.get(), rows + 1, kRowBytes).IsFull());
  ASSERT_TRUE(cache_->GetStats(&st).ok());
  EXPECT_FALSE(st.spills_now);
  std::string log = server_.ReadLog();
  EXPECT_NE(log.find("spilling stopped: the spill database"), std::string::npos) << log;
  EXPECT_EQ(log.find("disk full"), std::string::npos) << log;
  // Rows in memory are still served.
  EXPECT_EQ(CheckRowsInChild(server_, session_, 100, true), 100);
  cache_.reset();
  CommandResult stop = server_.Stop();
  EXPECT_EQ(stop.exit_code, 0) << stop.Describe();
}

TEST(CapacityTest, TooLargeRowSpillsAloneAndLaterRowsStayInMemory) {
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
  {
    TestServer server(WithArgs({"-s", spill}));
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    uint32_t session = server.NewSession();
    auto cache = OpenCache(server, session, 8, true);
    ASSERT_TRUE(PutBytes(cache.get(), 1000, kRowBytes).ok());
    bool inserted = false;
    Status s = PutBytes(cache.get(), 1001, 12 * kMB, &inserted);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(inserted);
    // One row larger than a 16 MB budget's leftover, through the daemon.
    auto roomy = OpenCache(server, session, 16, true, "roomy");
    ASSERT_TRUE(PutBytes(roomy.get(), 1000, kRowBytes).ok());
    ASSERT_TRUE(PutBytes(roomy.get(), 1001, 13 * kMB).ok());
    for (Cache* c : {cache.get(), roomy.get()}) {
      EXPECT_EQ(PutRows(c, 100), 100u);
      CacheStats st;
      ASSERT_TRUE(c->GetStats(&st).ok());
      EXPECT_EQ(st.disk_rows, 1u) << "only the large row is on disk";
      EXPECT_EQ(st.mem_rows, 101u);
      EXPECT_FALSE(st.spills_now);
      EXPECT_FALSE(st.full);
    }
    Row row;
    ASSERT_TRUE(cache->Get(1001, &row).ok());
    auto col = row.find("data");
    ASSERT_TRUE(col.has_value());
    EXPECT_EQ(col->nbytes, 12 * kMB);
    EXPECT_EQ(0, std::memcmp(col->data, Pattern(1001, 7, 12 * kMB).data(), 12 * kMB));
  }
}

}  // namespace
}  // namespace shmcache::test
