// Spilled rows are read by the client itself from the spill database (a
// RocksDB secondary instance, lib/spill_reader.h), and through the daemon
// only for rows newer than the reader's view. Whatever happens meanwhile
// (the daemon killed and restarted, the cache dropped, another process
// spilling rows, a row's bytes changed on the disk) a read returns the
// row's own bytes or a clear error: never another row's bytes, a miss for
// a row that is there, a hang or a crash.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include "format/spill_format.h"
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

// A server spilling into a directory, and a cache of a session of it
// holding rows [0, kRows); `spilled`: the first of them on disk.
struct Filled {
  std::unique_ptr<TestServer> server;
  uint32_t session = 0;
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  uint64_t spilled = 0;
};

void StartFilled(const std::string& spill, Filled* f) {
  f->server = std::make_unique<TestServer>(WithArgs({"-s", spill}));
  ASSERT_TRUE(f->server->ok()) << f->server->start_result().Describe();
  f->session = f->server->NewSession();
  ASSERT_TRUE(OpenSpilling(*f->server, f->session, &f->client, &f->cache).ok());
  ASSERT_TRUE(PutRows(f->cache.get(), 0, kRows));
  f->spilled = FirstSpilled(f->cache.get(), kRows);
}

TEST(SpillReadTest, SpilledRowsReadRightWhileTheDaemonIsKilledAndRestarted) {
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
  {
    Filled filled;
    ASSERT_NO_FATAL_FAILURE(StartFilled(spill, &filled));
    auto& [first, session, client, cache, spilled] = filled;
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
}

// The one database in `spill` (the instance's: SpillDbPath).
std::string SpillDbIn(const std::string& spill) {
  for (const auto& e : std::filesystem::directory_iterator(spill)) {
    if (e.is_directory()) return e.path();
  }
  return "";
}

TEST(SpillReadTest, ASpilledRowThatIsNotTheRowIsDroppedAndTheOthersRead) {
  // Bytes that pass RocksDB's checks but are not the row: written into the
  // database while the daemon was down (the row cut short), then read by a
  // restarted daemon that adopted the cache. The codec's check finds it.
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
  {
    Filled filled;
    ASSERT_NO_FATAL_FAILURE(StartFilled(spill, &filled));
    auto& [first, session, client, cache, spilled] = filled;
    const uint64_t bad = (spilled + kRows) / 2;
    first->Kill();
    {
      rocksdb::DB* raw = nullptr;
      rocksdb::Status s = rocksdb::DB::Open(SpillDbOptions(), SpillDbIn(spill), &raw);
      ASSERT_TRUE(s.ok()) << s.ToString();
      std::unique_ptr<rocksdb::DB> db(raw);
      std::string row;
      ASSERT_TRUE(
          db->Get(rocksdb::ReadOptions(), SpillKey(cache->cache_id(), bad).slice(), &row)
              .ok());
      row.resize(row.size() / 2);
      ASSERT_TRUE(
          db->Put(rocksdb::WriteOptions(), SpillKey(cache->cache_id(), bad).slice(), row)
              .ok());
      ASSERT_TRUE(db->Close().ok());
    }
    TestServer second(SameInstance(*first, {"-s", spill}));
    ASSERT_TRUE(second.ok()) << second.start_result().Describe();
    Row got;
    Status s;
    // Until the restarted server serves, a call finds none (Unavailable).
    // (A lambda does not capture a structured binding under clang 14.)
    Cache* const reader = cache.get();
    ASSERT_TRUE(WaitFor([&] { return !(s = reader->Get(bad, &got)).IsUnavailable(); }));
    EXPECT_TRUE(s.IsRowDropped()) << s.ToString();
    EXPECT_NE(s.message().find(fmt::format("row {} ", bad)), std::string::npos)
        << s.ToString();
    EXPECT_EQ(cache->SpilledRowsDropped(), 1u);
    s = cache->Get(bad, &got);
    EXPECT_TRUE(s.IsNotFound() && !s.IsRowDropped()) << s.ToString();
    for (uint64_t id = spilled; id < kRows; ++id) {
      if (id == bad) continue;
      std::string error;
      ASSERT_EQ(ReadRow(cache.get(), id, &error), Read::kRight) << id << " " << error;
    }
    ASSERT_TRUE(PutRows(cache.get(), bad, bad + 1));
    std::string error;
    EXPECT_EQ(ReadRow(cache.get(), bad, &error), Read::kRight) << error;
    cache.reset();
    EXPECT_EQ(second.Stop().exit_code, 0);
  }
}

TEST(SpillReadTest, SpilledRowsReadWhileAnotherProcessSpillsRows) {
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
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
}

struct Progress {
  std::atomic<int> passes{0};
  std::atomic<int> wrong{0};
  std::atomic<int> errors{0};
  std::atomic<bool> stop{false};
};

TEST(SpillReadTest, SpilledRowsReadWhileTheCacheIsDroppedAreRightOrAClearError) {
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
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
}

// Where `bytes` stand in the table files of the spill database under
// `dir`: (file, offset) for each place.
std::vector<std::pair<std::string, size_t>> FindInTables(
    const std::string& dir, const std::vector<uint8_t>& bytes) {
  std::vector<std::pair<std::string, size_t>> at;
  const std::string want(bytes.begin(), bytes.end());
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.path().extension() != ".sst") continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string table((std::istreambuf_iterator<char>(in)), {});
    for (size_t i = table.find(want); i != std::string::npos; i = table.find(want, i + 1))
      at.emplace_back(e.path(), i);
  }
  return at;
}

TEST(SpillReadTest, ASpilledRowThatFailsItsChecksumIsDroppedAndTheOthersRead) {
  // 3 KB rows (read by MultiGet) and 128 KB rows (by iterator seeks), each
  // size a cache and a server of its own; a bit of one spilled row flipped
  // in its table file, as a bad disk would. The read that meets it is told
  // (RowDropped, counted as a miss), the daemon drops it, every later read
  // is a plain miss until the row is put again, and every other row reads.
  for (const size_t row_bytes : {size_t{3} << 10, size_t{128} << 10}) {
    SCOPED_TRACE(fmt::format("rows of {} bytes", row_bytes));
    TempDir spill_dir(TestTmpRoot());
    const std::string& spill = spill_dir.path();
    {
      TestServer server(WithArgs({"-s", spill}));
      ASSERT_TRUE(server.ok()) << server.start_result().Describe();
      std::unique_ptr<Client> client;
      ASSERT_TRUE(server.Connect(&client).ok());
      std::unique_ptr<Cache> cache;
      ASSERT_TRUE(
          client->OpenCache(CacheNamed(server.NewSession(), "corrupt", 1, true), &cache)
              .ok());
      const uint64_t n = (uint64_t{6} << 20) / row_bytes;
      for (uint64_t id = 0; id < n; ++id) {
        std::vector<uint8_t> row = Pattern(id, kSalt, row_bytes);
        ASSERT_TRUE(cache->Put(id, row.data(), row.size()).ok()) << id;
      }
      const uint64_t spilled = FirstSpilled(cache.get(), n);
      // Every 4th spilled row: no two in one table block.
      std::vector<uint64_t> ids;
      for (uint64_t id = spilled; id < n && ids.size() < 16; id += 4) ids.push_back(id);
      ASSERT_GE(ids.size(), 8u);
      const uint64_t bad = ids[ids.size() / 2];
      const std::vector<uint8_t> bad_row = Pattern(bad, kSalt, row_bytes);
      // In a table file once the daemon has flushed (after its writes stop);
      // every copy found is flipped (an obsolete file a compaction left may
      // not be deleted yet).
      std::vector<std::pair<std::string, size_t>> at;
      ASSERT_TRUE(WaitFor([&] { return !(at = FindInTables(spill, bad_row)).empty(); }))
          << "row " << bad << " never reached a table file";
      for (const auto& [file, offset] : at) {
        std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
        f.seekp(static_cast<std::streamoff>(offset + row_bytes / 2));
        f.put(static_cast<char>(bad_row[row_bytes / 2] ^ 0x20));
        ASSERT_TRUE(f.good()) << file;
      }
      // The row is in the table file before the flush that writes it ends,
      // and a reader that replayed the daemon's log before then holds it in
      // memory too (until it next catches up, within a second): it reads
      // the row whole from there, rightly. Once the error is seen, the
      // rounds below ask that it stays an error.
      Status first_error;
      ASSERT_TRUE(WaitFor([&] {
        std::vector<Row> row(1);
        std::vector<Status> status(1);
        const std::vector<uint64_t> one{bad};
        Status call = cache->GetBatch(one, row, status);
        if (!call.ok() || !status[0].ok()) {
          first_error = call.ok() ? status[0] : call;
          return true;
        }
        std::optional<ColumnView> c = row[0].view().find("data");
        if (c && c->nbytes == bad_row.size() &&
            std::memcmp(c->data, bad_row.data(), bad_row.size()) == 0)
          return false;
        first_error = Status::Corruption("read OK, with wrong bytes");
        ADD_FAILURE() << "row " << bad << " read OK, with wrong bytes";
        return true;
      })) << "the flipped bit of row "
          << bad << " was never seen";
      // Never the row's bad bytes, nor a silent miss: RowDropped, naming
      // the row and the daemon's own read's error.
      EXPECT_TRUE(first_error.IsRowDropped()) << first_error.ToString();
      EXPECT_NE(first_error.ToString().find("Corruption"), std::string::npos)
          << first_error.ToString();
      EXPECT_NE(first_error.ToString().find(fmt::format("row {} ", bad)),
                std::string::npos)
          << first_error.ToString();
      EXPECT_EQ(cache->SpilledRowsDropped(), 1u);
      CacheStats before;
      ASSERT_TRUE(cache->GetStats(&before).ok());
      EXPECT_EQ(before.disk_rows, n - spilled - 1) << "the dropped row is not counted";
      for (int round = 0; round < 2; ++round) {
        std::vector<Row> rows(ids.size());
        std::vector<Status> statuses(ids.size());
        ASSERT_TRUE(cache->GetBatch(ids, rows, statuses).ok());
        for (size_t k = 0; k < ids.size(); ++k) {
          if (ids[k] == bad) {
            // Dropped: a plain miss, which a trainer computes and puts again.
            EXPECT_TRUE(statuses[k].IsNotFound() && !statuses[k].IsRowDropped())
                << "corrupt row " << bad << ": " << statuses[k].ToString();
            continue;
          }
          ASSERT_TRUE(statuses[k].ok())
              << "row " << ids[k] << ": " << statuses[k].ToString();
          const std::vector<uint8_t> want = Pattern(ids[k], kSalt, row_bytes);
          std::optional<ColumnView> c = rows[k].view().find("data");
          ASSERT_TRUE(c && c->nbytes == want.size() &&
                      std::memcmp(c->data, want.data(), want.size()) == 0)
              << "row " << ids[k] << " not read back whole, round " << round;
        }
      }
      CacheStats after;
      ASSERT_TRUE(cache->GetStats(&after).ok());
      EXPECT_EQ(after.misses, before.misses + 2) << "the dropped row, once a round";
      EXPECT_EQ(after.hits, before.hits + 2 * (ids.size() - 1));
      EXPECT_EQ(after.disk_rows, before.disk_rows);
      EXPECT_EQ(cache->SpilledRowsDropped(), 1u);
      // Put again, it is served whole, from a write after the damaged one.
      bool inserted = false;
      ASSERT_TRUE(cache->Put(bad, bad_row.data(), bad_row.size(), &inserted).ok());
      EXPECT_TRUE(inserted);
      ASSERT_TRUE(WaitFor([&] {
        Row row;
        Status s = cache->Get(bad, &row);
        EXPECT_FALSE(s.IsRowDropped()) << s.ToString();
        std::optional<ColumnView> c = row.view().find("data");
        return s.ok() && c && c->nbytes == bad_row.size() &&
               std::memcmp(c->data, bad_row.data(), bad_row.size()) == 0;
      })) << "row "
          << bad << " put again is not read back";
      cache.reset();
      EXPECT_EQ(server.Stop().exit_code, 0);
    }
  }
}

}  // namespace
}  // namespace shmcache::test
