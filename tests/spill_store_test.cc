// The spill database's memtables (daemon/spill_store.h): sized to the room
// on the disk at open (4 of 16 MB on a roomy disk, 2 of 8 MB on a small
// one), and rows written in batches across more than one memtable, the
// newest of them not flushed, read back whole by another process through
// its own secondary instance, as the daemon's readers do; rows flushed to
// a table file once writes stop, and a reader that reads them lets go of
// the copies it replayed from the log. Rows of a few KB are a table block
// each (a reader checksums a row's whole block), small rows share one. A
// full disk with the small memtables: spill_stage_test.cc, spill_test.cc.
// A fill in id order with pauses leaves disjoint table files (the flush
// marker follows the last row written). The memory of flushed memtables,
// kept for the next ones while writes come, is handed back once they stop.
#include "daemon/spill_store.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/table_properties.h>
#include <rocksdb/write_batch.h>

#include "format/spill_format.h"
#include "lib/spill_reader.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"
#include "tests/support/sanitizer.h"
#include "tests/support/tmpfs_mount.h"
#include "tests/support/wait_for.h"

namespace shmcache {
namespace {

constexpr uint64_t kMB = 1u << 20;
constexpr uint32_t kCache = 3;

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs v {};
  if (statvfs(dir.c_str(), &v) != 0) return 0;
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
}

// Row `id`'s bytes: distinct per id and per position, so a row read back
// torn, short or under another id does not match.
std::string RowOf(uint64_t id, size_t bytes) {
  std::string row(bytes, '\0');
  for (size_t i = 0; i < bytes; i += 8) row[i] = static_cast<char>(id * 31 + i / 8);
  row[bytes - 1] = static_cast<char>(id);
  return row;
}

// Rows of `row_bytes` written to a new store and flushed to its table
// files: how many rows, and the data blocks of those files.
void BlocksOfRows(size_t row_bytes, uint64_t* rows, uint64_t* blocks) {
  test::TempDir tmp(test::TestTmpRoot());
  const std::string& dir = tmp.path();
  {
    std::unique_ptr<SpillStore> store;
    ASSERT_TRUE(SpillStore::Open(dir + "/db", &store).ok());
    *rows = (4 * kMB) / row_bytes;
    rocksdb::WriteBatch batch;
    for (uint64_t id = 0; id < *rows; ++id) {
      SpillKey k(kCache, id);
      ASSERT_TRUE(batch.Put(k.slice(), RowOf(id, row_bytes)).ok());
    }
    ASSERT_TRUE(
        store->Write(&batch, *rows * row_bytes, SpillKey(kCache, *rows - 1)).ok());
    // Flushed once writes stop; the flush marker stays unflushed.
    ASSERT_TRUE(test::WaitFor([&] { return store->UnflushedRows() <= 1; }));
    // Read as a reader opens the database (the writer's table options are
    // in the files).
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::OpenAsSecondary(SpillReaderOptions(), store->path(),
                                             dir + "/sec", &db)
                    .ok());
    std::unique_ptr<rocksdb::DB> reader(db);
    rocksdb::TablePropertiesCollection tables;
    ASSERT_TRUE(reader->GetPropertiesOfAllTables(&tables).ok());
    *blocks = 0;
    for (const auto& [file, props] : tables) *blocks += props->num_data_blocks;
  }
}

TEST(SpillStoreTest, RowsOfAFewKBAreABlockEachAndSmallRowsShareOne) {
  // A reader checksums the whole block of a row it reads: a 3 KB row's
  // block holds no other row's bytes.
  uint64_t rows = 0, blocks = 0;
  BlocksOfRows(3 << 10, &rows, &blocks);
  EXPECT_GE(blocks, rows) << rows << " rows of 3 KB in " << blocks << " blocks";
  // 200-byte rows still fill 4 KB blocks (about 17 rows each).
  BlocksOfRows(200, &rows, &blocks);
  EXPECT_LT(blocks * 12, rows) << rows << " rows of 200 B in " << blocks << " blocks";
}

TEST(SpillStoreTest, MemtablesFollowTheRoomOnTheDisk) {
  using M = SpillStore::Memtables;
  const M small = SpillStore::MemtablesFor(SpillStore::kRoomyDiskBytes - 1);
  const M roomy = SpillStore::MemtablesFor(SpillStore::kRoomyDiskBytes);
  EXPECT_EQ(small.bytes, 8 * kMB);
  EXPECT_EQ(small.count, 2);
  EXPECT_EQ(roomy.bytes, 16 * kMB);
  EXPECT_EQ(roomy.count, 4);
  // At most 64 MB unflushed (what each reader's secondary instance may
  // replay), and a disk of 16 times that before they are used.
  EXPECT_EQ(roomy.total(), 64 * kMB);
  EXPECT_EQ(SpillStore::kRoomyDiskBytes, 16 * roomy.total());
}

TEST(SpillStoreTest, OpenSizesTheMemtablesToItsDisk) {
  test::TempDir tmp(test::TestTmpRoot());
  const std::string& dir = tmp.path();
  const uint64_t free_bytes = FreeBytes(dir);
  // Near the threshold the disk's use may cross it between the two looks.
  if (free_bytes / 16 * 15 < SpillStore::kRoomyDiskBytes &&
      free_bytes / 16 * 17 > SpillStore::kRoomyDiskBytes) {
    GTEST_SKIP() << "the test dir's disk has about kRoomyDiskBytes free";
  }
  {
    std::unique_ptr<SpillStore> store;
    ASSERT_TRUE(SpillStore::Open(dir + "/db", &store).ok());
    EXPECT_EQ(store->memtables().bytes, SpillStore::MemtablesFor(free_bytes).bytes);
    EXPECT_EQ(store->memtables().count, SpillStore::MemtablesFor(free_bytes).count);
  }
  test::TmpfsMount small("32m");
  if (!small.mounted()) GTEST_SKIP() << small.skip_reason();
  std::unique_ptr<SpillStore> store;
  ASSERT_TRUE(SpillStore::Open(small.path() + "/db", &store).ok());
  EXPECT_EQ(store->memtables().bytes, 8 * kMB);
  EXPECT_EQ(store->memtables().count, 2);
}

// The free space is read once per interval of writes, not before every
// write: the fstatvfs was one of the daemon's 9 system calls per spilled
// Put (docs/spill-reads.md). Near the end of a small disk it is read again
// at every write, and the write that would eat into the room the
// memtables' flush needs is still refused by that check (Full), before
// RocksDB sees it.
TEST(SpillStoreTest, FreeSpaceIsReadOncePerIntervalAndAtEveryWriteNearAFullDisk) {
  test::TempDir tmp(test::TestTmpRoot());
  {
    std::unique_ptr<SpillStore> store;
    ASSERT_TRUE(SpillStore::Open(tmp.path() + "/db", &store).ok());
    const uint64_t before = store->TEST_SpaceReads();
    const auto start = std::chrono::steady_clock::now();
    constexpr uint64_t kWrites = 200;
    for (uint64_t id = 0; id < kWrites; ++id) {
      const std::string row = RowOf(id, 3072);
      ASSERT_TRUE(
          store
              ->Put(kCache, id,
                    std::span(reinterpret_cast<const std::byte*>(row.data()), row.size()))
              .ok());
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    // One read per 100 ms begun, and the first write's.
    const uint64_t bound = 2 + static_cast<uint64_t>(ms) / 100;
    EXPECT_LE(store->TEST_SpaceReads() - before, std::min(bound, kWrites - 1))
        << kWrites << " writes in " << ms << " ms";
  }
  test::TmpfsMount small("32m");
  if (!small.mounted()) GTEST_SKIP() << small.skip_reason();
  std::unique_ptr<SpillStore> store;
  ASSERT_TRUE(SpillStore::Open(small.path() + "/db", &store).ok());
  const std::string row = RowOf(1, 256 << 10);
  Status s;
  uint64_t written = 0;
  for (uint64_t id = 0; id < 1000 && s.ok(); ++id) {
    s = store->Put(kCache, id,
                   std::span(reinterpret_cast<const std::byte*>(row.data()), row.size()));
    written += s.ok() ? 1 : 0;
  }
  EXPECT_GT(written, 0u);
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_NE(s.message().find("needed to go on spilling"), std::string::npos)
      << "refused by RocksDB, not by the check: " << s.ToString();
}

TEST(SpillStoreTest, BatchesBeyondAMemtableReadBackWholeInAnotherProcess) {
  test::TempDir tmp(test::TestTmpRoot());
  const std::string path = tmp.path() + "/db";
  // The reader, another process as a client is, is forked before the store
  // opens and told by a pipe how many rows to read once they are written.
  // Forked after the writes, it copied a process whose RocksDB threads were
  // flushing them: AddressSanitizer's allocator (clang 14) takes no lock
  // around fork, so a child forked while another thread held one of its
  // locks blocked for good at its first allocation of that size (a CI run:
  // the child killed after WaitChild's 60 s).
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  struct Reader {  // the pipe closed and the child reaped, whatever happens
    int fd;
    pid_t pid = -1;
    ~Reader() {
      if (fd >= 0) close(fd);
      if (pid > 0) test::WaitChild(pid);
    }
  } reader_child{go[1]};
  const size_t row_bytes = kMB / 2;
  reader_child.pid = test::ForkChild([&] {
    close(go[1]);
    uint64_t n = 0;
    if (read(go[0], &n, sizeof n) != static_cast<ssize_t>(sizeof n)) return 6;
    std::unique_ptr<SpillReader> reader;
    if (!SpillReader::Open(path, &reader).ok()) return 2;
    std::vector<uint64_t> ids;
    for (uint64_t id = 0; id < n; ++id) ids.push_back(id);
    bool torn = false;
    auto read_rows = [&] {  // reads ids, leaves in it those not found
      std::unique_ptr<bool[]> got(new bool[ids.size()]());
      reader->MultiGet(
          kCache, ids, row_bytes,
          [&](size_t i, std::span<const std::byte> bytes) {
            const std::string want = RowOf(ids[i], row_bytes);
            torn |= bytes.size() != want.size() ||
                    !std::equal(bytes.begin(), bytes.end(),
                                reinterpret_cast<const std::byte*>(want.data()));
          },
          std::span(got.get(), ids.size()));
      std::vector<uint64_t> left;
      for (size_t i = 0; i < ids.size(); ++i)
        if (!got[i]) left.push_back(ids[i]);
      ids = std::move(left);
    };
    read_rows();
    // The store flushes once writes stop: a view opened while it did can
    // lack rows (neither in its tables nor in a log still there). A client
    // then catches up and reads them again (CacheImpl::FetchSpilled), as
    // here; a row found is never torn.
    for (int tries = 0; tries < 5 && !ids.empty() && !torn; ++tries) {
      if (!test::WaitFor(
              [&] { return reader->MaybeCatchUp() == SpillReader::CatchUp::kDone; }))
        return 4;
      read_rows();
    }
    return torn ? 3 : !ids.empty() ? 5 : 0;
  });
  close(go[0]);
  ASSERT_GT(reader_child.pid, 0);
  std::unique_ptr<SpillStore> store;
  ASSERT_TRUE(SpillStore::Open(path, &store).ok());
  // More rows than one memtable holds: some are flushed to a table file,
  // the last ones are only in the write-ahead log when the reader opens.
  const uint64_t n = (store->memtables().bytes + 16 * kMB) / row_bytes;
  const uint64_t batch_rows = 16;
  for (uint64_t b = 0; b < n; b += batch_rows) {
    rocksdb::WriteBatch batch;
    uint64_t bytes = 0;
    for (uint64_t id = b; id < std::min(n, b + batch_rows); ++id) {
      const std::string row = RowOf(id, row_bytes);
      SpillKey k(kCache, id);
      ASSERT_TRUE(batch.Put(k.slice(), row).ok());
      bytes += row.size();
    }
    Status s =
        store->Write(&batch, bytes, SpillKey(kCache, std::min(n, b + batch_rows) - 1));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ASSERT_EQ(write(go[1], &n, sizeof n), static_cast<ssize_t>(sizeof n));
  const pid_t pid = std::exchange(reader_child.pid, -1);
  EXPECT_EQ(test::WaitChild(pid), 0)
      << "2: no reader; 3: a row not read back whole; 4: no catch-up; 5: rows not "
         "found; 6: no row count";
  store.reset();
}

// Writes rows first..first+n-1 of `bytes` each in one batch.
// The size of a key of cache `cache` in the database at `path`, read as it
// is (opened read-only: its log replayed too), or 0 when it holds none.
size_t KeyLeftOf(const std::string& path, uint32_t cache) {
  rocksdb::DB* raw = nullptr;
  rocksdb::Status rs = rocksdb::DB::OpenForReadOnly(SpillDbOptions(), path, &raw);
  EXPECT_TRUE(rs.ok()) << rs.ToString();
  if (!rs.ok()) return 0;
  std::unique_ptr<rocksdb::DB> db(raw);
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  const SpillKey begin(cache, 0);
  const rocksdb::Slice prefix(begin.bytes, sizeof cache);
  it->Seek(prefix);
  return it->Valid() && it->key().starts_with(prefix) ? it->key().size() : 0;
}

void WriteRowsInOrder(SpillStore* store, uint64_t first, uint64_t n, size_t bytes) {
  rocksdb::WriteBatch batch;
  for (uint64_t id = first; id < first + n; ++id) {
    ASSERT_TRUE(batch.Put(SpillKey(kCache, id).slice(), RowOf(id, bytes)).ok());
  }
  ASSERT_TRUE(store->Write(&batch, n * bytes, SpillKey(kCache, first + n - 1)).ok());
}

TEST(SpillStoreTest, RowsAreFlushedOnceWritesStopAndReadersLetGoOfTheirCopies) {
  test::TempDir tmp(test::TestTmpRoot());
  const std::string& dir = tmp.path();
  std::unique_ptr<SpillStore> store;
  ASSERT_TRUE(SpillStore::Open(dir + "/db", &store).ok());
  // Far fewer rows than a memtable holds: RocksDB would keep them there.
  constexpr uint64_t kRows = 200;
  constexpr size_t kRowBytes = 3 << 10;
  ASSERT_NO_FATAL_FAILURE(WriteRowsInOrder(store.get(), 0, kRows, kRowBytes));
  // A reader opened now replays them from the log into its memtable.
  std::unique_ptr<SpillReader> reader;
  ASSERT_TRUE(SpillReader::Open(store->path(), &reader).ok());
  ASSERT_EQ(reader->MemtableRows(), kRows);
  // Writes stopped: the store flushes them (what stays is the one key it
  // writes after a flush so that readers drop their copies).
  EXPECT_TRUE(test::WaitFor([&] { return store->UnflushedRows() <= 1; }))
      << store->UnflushedRows() << " rows still in the daemon's memtables";
  // The reader, reading, catches up and keeps no copy; every row still
  // reads back whole, now from the table file.
  std::vector<uint64_t> ids(kRows);
  for (uint64_t id = 0; id < kRows; ++id) ids[id] = id;
  std::unique_ptr<bool[]> got(new bool[kRows]());
  uint64_t whole = 0;
  auto read_all = [&] {
    whole = 0;
    reader->MultiGet(
        kCache, ids, kRowBytes,
        [&](size_t i, std::span<const std::byte> bytes) {
          const std::string want = RowOf(ids[i], kRowBytes);
          whole += bytes.size() == want.size() &&
                   std::equal(bytes.begin(), bytes.end(),
                              reinterpret_cast<const std::byte*>(want.data()));
        },
        std::span(got.get(), kRows));
  };
  EXPECT_TRUE(test::WaitFor([&] {
    read_all();
    return reader->MemtableRows() <= 1;
  })) << reader->MemtableRows()
      << " rows still in the reader's memtables";
  read_all();
  EXPECT_EQ(whole, kRows);
  reader.reset();
  store.reset();
}

// A fill in id order whose writes pause (a flush once they stop, then the
// flush marker) must leave table files over disjoint key ranges, which
// RocksDB moves down the levels as they are. With the marker at the end of
// the key space every file flushed after a pause spanned to there and
// overlapped the next: each was rewritten by a compaction (half the
// daemon's CPU in a spilling PutBatch, docs/spill-reads.md). Dropping the
// cache removes its markers with its rows.
TEST(SpillStoreTest, FlushesAfterPausesOfAFillInIdOrderLeaveDisjointTableFiles) {
  test::TempDir tmp(test::TestTmpRoot());
  const std::string& dir = tmp.path();
  std::unique_ptr<SpillStore> store;
  ASSERT_TRUE(SpillStore::Open(dir + "/db", &store).ok());
  constexpr uint64_t kRowsPerPause = 100;
  constexpr size_t kRowBytes = 3 << 10;
  constexpr int kPauses = 3;
  for (int p = 0; p < kPauses; ++p) {
    ASSERT_NO_FATAL_FAILURE(
        WriteRowsInOrder(store.get(), p * kRowsPerPause, kRowsPerPause, kRowBytes));
    // Flushed, and the marker written after the flush: it alone is left.
    ASSERT_TRUE(test::WaitFor([&] { return store->UnflushedRows() == 1; }))
        << store->UnflushedRows() << " keys in the memtables";
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status rs =
      rocksdb::DB::OpenForReadOnly(SpillDbOptions(), store->path(), &raw);
  ASSERT_TRUE(rs.ok()) << rs.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  std::vector<rocksdb::LiveFileMetaData> files;
  db->GetLiveFilesMetaData(&files);
  ASSERT_EQ(files.size(), static_cast<size_t>(kPauses));
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.smallestkey < b.smallestkey; });
  for (size_t i = 1; i < files.size(); ++i) {
    EXPECT_LT(files[i - 1].largestkey, files[i].smallestkey)
        << "table files " << files[i - 1].name << " and " << files[i].name << " overlap";
  }
  db.reset();
  ASSERT_TRUE(store->DropCache(kCache).ok());
  EXPECT_EQ(KeyLeftOf(store->path(), kCache), 0u)
      << "bytes of a key of the dropped cache";
  store.reset();
}

// A cache dropped while a flush is due (its rows were the last written,
// less than kIdleFlushMs ago) keeps no key: the flush's marker, which
// follows the last row written, went among its deleted rows, where nothing
// removed it.
TEST(SpillStoreTest, ACacheDroppedWhileAFlushIsDueKeepsNoKey) {
  test::TempDir tmp(test::TestTmpRoot());
  std::unique_ptr<SpillStore> store;
  ASSERT_TRUE(SpillStore::Open(tmp.path() + "/db", &store).ok());
  // The drop must come before the idle flush begins: a loaded host may
  // delay it past that, and then a later cache is tried.
  uint32_t cache = kCache;
  bool due = false;
  for (int attempt = 0; attempt < 20 && !due; ++attempt) {
    cache = kCache + static_cast<uint32_t>(attempt);
    rocksdb::WriteBatch batch;
    for (uint64_t id = 0; id < 10; ++id) {
      ASSERT_TRUE(batch.Put(SpillKey(cache, id).slice(), RowOf(id, 100)).ok());
    }
    ASSERT_TRUE(store->Write(&batch, uint64_t{10} * 100, SpillKey(cache, 9)).ok());
    ASSERT_TRUE(store->DropCache(cache).ok());
    due = store->TEST_FlushDue();
  }
  ASSERT_TRUE(due) << "every drop came after its rows' idle flush had begun";
  // The drop flushed the memtables; the idle flush that was due leaves its
  // marker alone there.
  ASSERT_TRUE(test::WaitFor([&] {
    return !store->TEST_FlushDue() && store->UnflushedRows() == 1;
  })) << store->UnflushedRows()
      << " keys in the memtables";
  // The marker is in the log only: KeyLeftOf replays it.
  EXPECT_EQ(KeyLeftOf(store->path(), cache), 0u) << "bytes of a key of the dropped cache";
}

// This process's resident bytes (/proc/self/statm).
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// The store keeps flushed memtables' memory in the heap for the next ones
// while writes come (no page faults to refill it); once writes stop and
// the idle flush ran, that memory goes back: a server that spilled once
// does not hold a memtable's worth or more for as long as it runs.
TEST(SpillStoreTest, MemtableMemoryGoesBackOnceWritesStop) {
#if defined(SHMCACHE_TEST_UNDER_ASAN) || defined(SHMCACHE_TEST_UNDER_TSAN)
  // The sanitizers' allocators replace glibc's, whose thresholds the store
  // sets and whose heap it trims, and hold freed memory in a quarantine.
  GTEST_SKIP() << "glibc's malloc is replaced by the sanitizer's";
#endif
  test::TempDir tmp(test::TestTmpRoot());
  std::unique_ptr<SpillStore> store;
  ASSERT_TRUE(SpillStore::Open(tmp.path() + "/db", &store).ok());
  const uint64_t before = ResidentBytes();
  // Three memtables' worth, so that some were flushed and freed while the
  // later ones filled.
  constexpr size_t kRowBytes = 256u << 10;
  const uint64_t rows = 3 * store->memtables().bytes / kRowBytes;
  for (uint64_t first = 0; first < rows; first += 16) {
    ASSERT_NO_FATAL_FAILURE(WriteRowsInOrder(store.get(), first, 16, kRowBytes));
  }
  ASSERT_TRUE(test::WaitFor([&] {
    return !store->TEST_FlushDue() && store->UnflushedRows() == 1 &&
           ResidentBytes() < before + store->memtables().bytes;
  })) << (ResidentBytes() - std::min(before, ResidentBytes())) / kMB
      << " MB more resident than before the writes, " << store->UnflushedRows()
      << " keys in the memtables";
}

}  // namespace
}  // namespace shmcache
