// Spilled rows are read by the client itself from the spill database (a
// RocksDB secondary instance, lib/spill_reader.h), and through the daemon
// only for rows newer than the reader's view. Whatever happens meanwhile
// (the daemon killed and restarted, the cache dropped, another process
// spilling rows) a read returns the row's own bytes or a clear error:
// never another row's bytes, a hang or a crash.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "shmcache/client.h"
#include "tests/support/child_process.h"
#include "tests/support/row_pattern.h"
#include "tests/support/test_server.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {
namespace {

constexpr uint64_t kSalt = 5;

// Most rows are 3 KB (kept in the database's tables); every 8th is 20 KB
// (in a blob file).
size_t RowBytes(uint64_t id) { return id % 8 == 7 ? 20u << 10 : 3u << 10; }

enum class Read { kRight, kMiss, kError, kWrong };

Read ReadRow(Cache* cache, uint64_t id, std::string* error = nullptr) {
  Row got;
  Status s = cache->Get(id, &got);
  if (s.IsNotFound()) return Read::kMiss;
  if (!s.ok()) {
    if (error) *error = s.ToString();
    return s.message().empty() ? Read::kWrong : Read::kError;
  }
  std::vector<uint8_t> want = Pattern(id, kSalt, RowBytes(id));
  std::optional<ColumnView> c = got.view().find("data");
  if (!c || c->nbytes != want.size() ||
      std::memcmp(c->data, want.data(), want.size()) != 0) {
    return Read::kWrong;
  }
  return Read::kRight;
}

Status OpenSpilling(const TestServer& server, uint32_t session,
                    std::unique_ptr<Client>* client, std::unique_ptr<Cache>* cache) {
  Status s = server.Connect(client);
  if (!s.ok()) return s;
  return (*client)->OpenCache(CacheNamed(session, "spilled", 1, true), cache);
}

// Puts rows [first, last); false on the first refused one.
bool PutRows(Cache* cache, uint64_t first, uint64_t last) {
  for (uint64_t id = first; id < last; ++id) {
    std::vector<uint8_t> row = Pattern(id, kSalt, RowBytes(id));
    if (!cache->Put(id, row.data(), row.size()).ok()) return false;
  }
  return true;
}

// Ids that the cache holds on disk: those at or past its first spilled row
// (rows spill only once memory is used up).
uint64_t FirstSpilled(Cache* cache, uint64_t n) {
  CacheStats st;
  EXPECT_TRUE(cache->GetStats(&st).ok());
  EXPECT_GT(st.disk_rows, 0u);
  EXPECT_EQ(st.mem_rows + st.disk_rows, n);
  return n - st.disk_rows;
}

// 1 MB of memory, 2.5 MB of rows: the rest is on disk.
constexpr uint64_t kRows = 600;

TEST(SpillReadTest, SpilledRowsReadRightWhileTheDaemonIsKilledAndRestarted) {
  std::string spill = MakeTempDir(TestTmpRoot(), "spill");
  {
    auto first = std::make_unique<TestServer>(WithArgs({"-s", spill}));
    ASSERT_TRUE(first->ok()) << first->start_result().Describe();
    const uint32_t session = first->NewSession();
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    ASSERT_TRUE(OpenSpilling(*first, session, &client, &cache).ok());
    ASSERT_TRUE(PutRows(cache.get(), 0, kRows));
    const uint64_t spilled = FirstSpilled(cache.get(), kRows);
    for (uint64_t id = spilled; id < kRows; ++id) {
      ASSERT_EQ(ReadRow(cache.get(), id), Read::kRight) << id;
    }

    // The daemon is gone: the spilled rows are still read, from the disk.
    first->Kill();
    for (uint64_t id = spilled; id < kRows; ++id) {
      std::string error;
      ASSERT_EQ(ReadRow(cache.get(), id, &error), Read::kRight) << id << " " << error;
    }

    // A restarted daemon adopts the index and the database; rows it
    // spills for another client are read by this one too.
    TestServer second(SameInstance(*first, {"-s", spill}));
    ASSERT_TRUE(second.ok()) << second.start_result().Describe();
    std::unique_ptr<Client> writer_client;
    std::unique_ptr<Cache> writer;
    ASSERT_TRUE(OpenSpilling(second, session, &writer_client, &writer).ok());
    ASSERT_TRUE(PutRows(writer.get(), kRows, kRows + 100));
    for (uint64_t id = spilled; id < kRows + 100; ++id) {
      std::string error;
      ASSERT_EQ(ReadRow(cache.get(), id, &error), Read::kRight) << id << " " << error;
    }
    cache.reset();
    writer.reset();
    EXPECT_EQ(second.Stop().exit_code, 0);
  }
  RemoveTree(spill);
}

TEST(SpillReadTest, SpilledRowsReadWhileAnotherProcessSpillsRows) {
  std::string spill = MakeTempDir(TestTmpRoot(), "spill");
  {
    TestServer server(WithArgs({"-s", spill}));
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    const uint32_t session = server.NewSession();
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    ASSERT_TRUE(OpenSpilling(server, session, &client, &cache).ok());
    ASSERT_TRUE(PutRows(cache.get(), 0, kRows));
    const uint64_t spilled = FirstSpilled(cache.get(), kRows);
    // This process reads the disk from here on; the writer's rows come after.
    ASSERT_EQ(ReadRow(cache.get(), spilled), Read::kRight);

    constexpr uint64_t kMore = 400;
    pid_t writer = ForkChild([&] {
      std::unique_ptr<Client> c;
      std::unique_ptr<Cache> w;
      if (!OpenSpilling(server, session, &c, &w).ok()) return 2;
      return PutRows(w.get(), kRows, kRows + kMore) ? 0 : 3;
    });
    ASSERT_GT(writer, 0);
    // Each row is a miss until its put returns, then the writer's bytes.
    bool writing = true;
    while (writing) {
      writing = !ProcessExited(writer);
      for (uint64_t id = kRows; id < kRows + kMore; ++id) {
        std::string error;
        Read r = ReadRow(cache.get(), id, &error);
        ASSERT_TRUE(r == Read::kRight || r == Read::kMiss) << id << " " << error;
      }
    }
    EXPECT_EQ(WaitChild(writer), 0);
    for (uint64_t id = spilled; id < kRows + kMore; ++id) {
      std::string error;
      ASSERT_EQ(ReadRow(cache.get(), id, &error), Read::kRight) << id << " " << error;
    }
    CacheStats st;
    ASSERT_TRUE(cache->GetStats(&st).ok());
    EXPECT_EQ(st.mem_rows + st.disk_rows, kRows + kMore);
  }
  RemoveTree(spill);
}

struct Progress {
  std::atomic<int> passes{0};
  std::atomic<int> wrong{0};
  std::atomic<int> errors{0};
  std::atomic<bool> stop{false};
};

TEST(SpillReadTest, SpilledRowsReadWhileTheCacheIsDroppedAreRightOrAClearError) {
  std::string spill = MakeTempDir(TestTmpRoot(), "spill");
  {
    TestServer server(WithArgs({"-s", spill}));
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    const uint32_t session = server.NewSession();
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    ASSERT_TRUE(OpenSpilling(server, session, &client, &cache).ok());
    ASSERT_TRUE(PutRows(cache.get(), 0, kRows));
    const uint64_t spilled = FirstSpilled(cache.get(), kRows);

    Progress* p = SharedBlock<Progress>();
    pid_t reader = ForkChild([&] {
      std::unique_ptr<Client> c;
      std::unique_ptr<Cache> r;
      if (!OpenSpilling(server, session, &c, &r).ok()) return 2;
      while (!p->stop.load()) {
        for (uint64_t id = spilled; id < kRows; ++id) {
          switch (ReadRow(r.get(), id)) {
            case Read::kWrong: p->wrong.fetch_add(1); break;
            case Read::kError: p->errors.fetch_add(1); break;
            default: break;
          }
        }
        p->passes.fetch_add(1);
      }
      return 0;
    });
    ASSERT_GT(reader, 0);
    ASSERT_TRUE(WaitFor([&] { return p->passes.load() >= 1; }));
    CommandResult d = server.Admin({"-d", std::to_string(session)});
    EXPECT_EQ(d.exit_code, 0) << d.Describe();
    // Reads go on after the drop, and end.
    const int after = p->passes.load();
    EXPECT_TRUE(WaitFor([&] { return p->passes.load() >= after + 2; }));
    p->stop.store(true);
    EXPECT_EQ(WaitChild(reader), 0);
    EXPECT_EQ(p->wrong.load(), 0);

    // In this process too: the dropped cache's rows are its own bytes or
    // an error that says what happened.
    for (uint64_t id = spilled; id < kRows; ++id) {
      std::string error;
      Read r = ReadRow(cache.get(), id, &error);
      ASSERT_NE(r, Read::kWrong) << id;
    }
  }
  RemoveTree(spill);
}

}  // namespace
}  // namespace shmcache::test
