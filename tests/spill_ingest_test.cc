// Large batches of spilled rows written as one table file that the spill
// database takes in (SpillStore::WriteRows, daemon/spill_store.h), and what
// the write-ahead log gave them before that still holds: the rows go past
// the log and the memtables, a reader's secondary instance in another
// process sees them; rows the database has already (in a file, in the
// memtables, from an earlier server) take the log instead, so that the
// newest value wins in readers too; a destroyed cache's rows are gone from
// ingested files, and its id takes no file again; a file a killed server
// left half-written is removed at the next open. Through a daemon and a SIGKILL:
// spill_stage_test.cc (LargeBatchesGoInAsTableFilesAndSurviveASigkill).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rocksdb/write_batch.h>

#include "daemon/spill_store.h"
#include "format/spill_format.h"
#include "lib/spill_reader.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"
#include "tests/support/wait_for.h"

namespace shmcache {
namespace {

constexpr uint32_t kCache = 3;
constexpr size_t kRowBytes = 150 << 10;
// Enough rows of kRowBytes for a batch that Ingest is meant for.
constexpr uint64_t kRows = SpillStore::kIngestBytes / kRowBytes + 2;

// Row `id`'s bytes in version `gen`: distinct per id, version and position.
std::string RowOf(uint64_t id, int gen, size_t bytes = kRowBytes) {
  std::string row(bytes, '\0');
  for (size_t i = 0; i < bytes; i += 8) row[i] = static_cast<char>(id * 31 + gen + i / 8);
  row[bytes - 1] = static_cast<char>(id + gen * 7);
  return row;
}

// WriteRows of rows `ids` of version `gen` into `cache`.
Status PutRows(SpillStore* store, uint32_t cache, const std::vector<uint64_t>& ids,
                  int gen) {
  std::vector<std::string> bytes;
  std::vector<SpillStore::Row> rows;
  bytes.reserve(ids.size());
  uint64_t total = 0;
  for (uint64_t id : ids) {
    bytes.push_back(RowOf(id, gen));
    total += bytes.back().size();
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    rows.push_back({ids[i], std::as_bytes(std::span(bytes[i]))});
  }
  return store->WriteRows(cache, rows, total);
}

std::vector<uint64_t> Ids(uint64_t first, uint64_t n) {
  std::vector<uint64_t> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = first + i;
  return ids;
}

// Per id of `ids`: the version of RowOf the reader returns, 0 when it does
// not find the row, -1 when the bytes are no version of it.
std::vector<int> Versions(SpillReader* reader, uint32_t cache,
                          const std::vector<uint64_t>& ids) {
  std::vector<int> gens(ids.size(), 0);
  std::unique_ptr<bool[]> got(new bool[ids.size()]());
  reader->MultiGet(
      cache, ids,
      [&](size_t i, std::span<const std::byte> bytes) {
        gens[i] = -1;
        for (int gen = 1; gen <= 9; ++gen) {
          const std::string want = RowOf(ids[i], gen);
          if (bytes.size() == want.size() &&
              std::equal(bytes.begin(), bytes.end(),
                         reinterpret_cast<const std::byte*>(want.data()))) {
            gens[i] = gen;
          }
        }
      },
      std::span(got.get(), ids.size()));
  return gens;
}

// Whether the reader, once it has caught up with the store as a client does
// (the writes before this call all done), reads version gens[i] of every
// row ids[i]: never an older version, and a row not found only while a
// flush of the store's runs beside the catch-up (found at a later one).
bool ReaderComesToRead(SpillReader* reader, uint32_t cache,
                       const std::vector<uint64_t>& ids, const std::vector<int>& gens) {
  bool stale = false;
  bool read = test::WaitFor([&] {
    if (reader->MaybeCatchUp() != SpillReader::CatchUp::kDone) return false;
    const std::vector<int> now = Versions(reader, cache, ids);
    for (size_t i = 0; i < ids.size(); ++i) stale |= now[i] != 0 && now[i] != gens[i];
    return stale || now == gens;
  });
  return read && !stale;
}

// The store's own answer for rows `ids`, as versions (see Versions).
std::vector<int> StoreVersions(SpillStore* store, uint32_t cache,
                               const std::vector<uint64_t>& ids) {
  std::vector<std::string> values;
  std::vector<bool> found;
  std::vector<int> gens(ids.size(), 0);
  if (!store->MultiGet(cache, ids, &values, &found).ok()) return {};
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!found[i]) continue;
    gens[i] = -1;
    for (int gen = 1; gen <= 9; ++gen) {
      if (values[i] == RowOf(ids[i], gen)) gens[i] = gen;
    }
  }
  return gens;
}

class SpillIngestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(SpillStore::Open(dir_ + "/db", &store_).ok());
  }
  void TearDown() override {
    store_.reset();
    test::RemoveTree(dir_);
  }
  const std::string dir_ = test::MakeTempDir(test::TestTmpRoot(), "spillingest");
  std::unique_ptr<SpillStore> store_;
};

TEST_F(SpillIngestTest, RowsGoPastTheLogAndAReaderInAnotherProcessSeesThem) {
  // A reader open before the rows are written, as a trainer's is.
  std::unique_ptr<SpillReader> early;
  ASSERT_TRUE(SpillReader::Open(store_->path(), &early).ok());
  const std::vector<uint64_t> ids = Ids(0, kRows);
  Status s = PutRows(store_.get(), kCache, ids, 1);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(store_->UnflushedRows(), 0u) << "the rows went into the memtables";
  EXPECT_TRUE(ReaderComesToRead(early.get(), kCache, ids, std::vector<int>(kRows, 1)));
  // Another process opens its own secondary instance and reads every row.
  pid_t child = test::ForkChild([&] {
    std::unique_ptr<SpillReader> reader;
    if (!SpillReader::Open(store_->path(), &reader).ok()) return 2;
    return Versions(reader.get(), kCache, ids) == std::vector<int>(kRows, 1) ? 0 : 3;
  });
  ASSERT_GT(child, 0);
  EXPECT_EQ(test::WaitChild(child), 0) << "2: no reader; 3: rows not read back whole";
}

TEST_F(SpillIngestTest, RowsTheDatabaseHasTakeTheLogAndTheNewestValueWins) {
  const std::vector<uint64_t> ids = Ids(0, kRows);
  ASSERT_TRUE(PutRows(store_.get(), kCache, ids, 1).ok());
  ASSERT_EQ(store_->UnflushedRows(), 0u) << "not a file";
  std::unique_ptr<SpillReader> reader;
  ASSERT_TRUE(SpillReader::Open(store_->path(), &reader).ok());
  ASSERT_EQ(Versions(reader.get(), kCache, ids), std::vector<int>(kRows, 1));
  // Version 2 of the same rows: through the log, over the file.
  ASSERT_TRUE(PutRows(store_.get(), kCache, ids, 2).ok());
  EXPECT_EQ(store_->UnflushedRows(), kRows) << "a file over rows the database has";
  EXPECT_EQ(StoreVersions(store_.get(), kCache, ids), std::vector<int>(kRows, 2));
  EXPECT_TRUE(ReaderComesToRead(reader.get(), kCache, ids, std::vector<int>(kRows, 2)));
  // Rows past them go in as a file again, beside the log's.
  const std::vector<uint64_t> next = Ids(kRows, kRows);
  ASSERT_TRUE(PutRows(store_.get(), kCache, next, 3).ok());
  EXPECT_EQ(store_->UnflushedRows(), kRows) << "not a file";
  EXPECT_TRUE(ReaderComesToRead(reader.get(), kCache, next, std::vector<int>(kRows, 3)));
  EXPECT_EQ(Versions(reader.get(), kCache, ids), std::vector<int>(kRows, 2));
  // A batch that holds one id twice keeps its later row.
  const std::vector<uint64_t> last = Ids(2 * kRows, kRows);
  std::vector<std::string> bytes = {RowOf(last[0], 4), RowOf(last[0], 5)};
  for (size_t i = 1; i < kRows; ++i) bytes.push_back(RowOf(last[i], 4));
  std::vector<SpillStore::Row> rows;
  rows.push_back({last[0], std::as_bytes(std::span(bytes[0]))});
  rows.push_back({last[0], std::as_bytes(std::span(bytes[1]))});
  for (size_t i = 1; i < kRows; ++i) {
    rows.push_back({last[i], std::as_bytes(std::span(bytes[i + 1]))});
  }
  ASSERT_TRUE(store_->WriteRows(kCache, rows, (kRows + 1) * kRowBytes).ok());
  EXPECT_EQ(store_->UnflushedRows(), kRows) << "not a file";
  std::vector<int> want(kRows, 4);
  want[0] = 5;
  EXPECT_EQ(StoreVersions(store_.get(), kCache, last), want);
  EXPECT_TRUE(ReaderComesToRead(reader.get(), kCache, last, want));
  // A store opened again (a restarted server) knows nothing of the rows:
  // RocksDB refuses a file over them, and version 6 takes the log; so do
  // the cache's rows after it, in this store's life.
  reader.reset();
  const std::string db = store_->path();
  store_.reset();
  ASSERT_TRUE(SpillStore::Open(db, &store_).ok());
  ASSERT_TRUE(SpillReader::Open(store_->path(), &reader).ok());
  const uint64_t before = store_->UnflushedRows();
  ASSERT_TRUE(PutRows(store_.get(), kCache, ids, 6).ok());
  EXPECT_EQ(store_->UnflushedRows(), before + kRows) << "a file over rows the database has";
  EXPECT_EQ(StoreVersions(store_.get(), kCache, ids), std::vector<int>(kRows, 6));
  EXPECT_TRUE(ReaderComesToRead(reader.get(), kCache, ids, std::vector<int>(kRows, 6)));
  ASSERT_TRUE(PutRows(store_.get(), kCache, Ids(3 * kRows, kRows), 7).ok());
  EXPECT_EQ(store_->UnflushedRows(), before + 2 * kRows);
}

void WriteFile(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

// Bytes of the database's table files.
uint64_t TableBytes(const std::string& db) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(db, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->path().extension() == ".sst") bytes += it->file_size(ec);
  }
  return bytes;
}

TEST_F(SpillIngestTest, ADroppedCacheIsGoneFromIngestedFiles) {
  const std::vector<uint64_t> ids = Ids(0, kRows);
  ASSERT_TRUE(PutRows(store_.get(), kCache, ids, 1).ok());
  ASSERT_TRUE(PutRows(store_.get(), kCache + 1, ids, 2).ok());
  std::unique_ptr<SpillReader> reader;
  ASSERT_TRUE(SpillReader::Open(store_->path(), &reader).ok());
  ASSERT_EQ(Versions(reader.get(), kCache, ids), std::vector<int>(kRows, 1));
  const uint64_t before = TableBytes(store_->path());
  ASSERT_GE(before, 2 * kRows * kRowBytes);
  ASSERT_TRUE(store_->DropCache(kCache).ok());
  EXPECT_EQ(StoreVersions(store_.get(), kCache, ids), std::vector<int>(kRows, 0));
  EXPECT_EQ(StoreVersions(store_.get(), kCache + 1, ids), std::vector<int>(kRows, 2));
  EXPECT_EQ(store_->CacheIds(), std::vector<uint32_t>{kCache + 1});
  // Its file's disk space is returned.
  EXPECT_TRUE(test::WaitFor([&] {
    return TableBytes(store_->path()) < before - kRows * kRowBytes / 2;
  })) << TableBytes(store_->path()) << " bytes of table files, " << before << " before";
  EXPECT_TRUE(ReaderComesToRead(reader.get(), kCache, ids, std::vector<int>(kRows, 0)));
  EXPECT_EQ(Versions(reader.get(), kCache + 1, ids), std::vector<int>(kRows, 2));
  // Its id, should it come again, takes the log: a reader may still hold
  // the dropped rows replayed from it.
  const uint64_t logged = store_->UnflushedRows();
  ASSERT_TRUE(PutRows(store_.get(), kCache, Ids(kRows, kRows), 3).ok());
  EXPECT_EQ(store_->UnflushedRows(), logged + kRows);
}

TEST_F(SpillIngestTest, FilesAKilledServerLeftAreRemovedAtOpen) {
  const std::string db = store_->path();
  store_.reset();
  // A file half-written for Ingest, and a link under that name to a file
  // that is not the server's to remove.
  const std::string left = db + "/" + SpillStore::kIngestPrefix + "7.tmp";
  const std::string target = dir_ + "/not-the-servers";
  const std::string link = db + "/" + SpillStore::kIngestPrefix + "8.tmp";
  WriteFile(left, "half a table file");
  WriteFile(target, "keep me");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ASSERT_TRUE(SpillStore::Open(db, &store_).ok());
  struct stat st {};
  EXPECT_NE(lstat(left.c_str(), &st), 0) << left << " is still there";
  EXPECT_NE(lstat(link.c_str(), &st), 0) << link << " is still there";
  EXPECT_EQ(lstat(target.c_str(), &st), 0) << "the link's target was removed";
  // And the store takes rows as before.
  ASSERT_TRUE(PutRows(store_.get(), kCache, Ids(0, kRows), 1).ok());
  EXPECT_EQ(StoreVersions(store_.get(), kCache, Ids(0, kRows)), std::vector<int>(kRows, 1));
}

}  // namespace
}  // namespace shmcache
