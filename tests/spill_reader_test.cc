// A client's reader of the spill database (lib/spill_reader.h) reads a
// batch of rows into buffers its thread keeps from call to call: a batch of
// small rows read again allocates no buffer per row (RocksDB copies every
// value it cannot pin, and with no block cache it pins none), rows over the
// kept size are read whole as well, and a kept buffer never shows a former
// row's bytes: rows of other sizes, ids asked twice and ids that are not
// there, in one batch, each read right. Large rows are read in place from
// the mapped table files (no buffer per row either), whatever the calls
// before read (smaller rows, another cache's), and an id between two
// rows, past the last, or another cache's is not found. A row whose block
// fails its checksum is left to the caller by either way of reading, and
// the call's other rows read whole.
#include "lib/spill_reader.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rocksdb/write_batch.h>

#include "daemon/spill_store.h"
#include "format/spill_format.h"
#include "tests/support/files.h"
#include "tests/support/sanitizer.h"
#include "tests/support/wait_for.h"

// Allocations through operator new of at least counted_bytes made by the
// thread that counts (RocksDB calls it for the strings it copies values
// into, a row's size or more; its own background threads are not counted).
// ThreadSanitizer's runtime defines operator new itself (a second
// definition does not link): there nothing is counted and the test that
// counts is skipped.

namespace {
thread_local bool counting = false;
thread_local size_t counted_bytes = 0;
thread_local uint64_t allocations = 0;
}  // namespace

#ifndef SHMCACHE_TEST_UNDER_TSAN
void* operator new(size_t n) {
  if (counting && n >= counted_bytes) ++allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// GCC pairs these frees with the library's operator new, not the one above
// (which mallocs), wherever a string made in the reader's callback is
// inlined and freed there: a false -Wmismatched-new-delete.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace shmcache {
namespace {

constexpr uint64_t kMB = 1u << 20;
constexpr uint32_t kCache = 5;
constexpr size_t kBatch = 64;

// Row `id`'s bytes, of `bytes` bytes: distinct per id and position, so a
// row read back short, torn or with another row's bytes does not match.
std::string RowOf(uint64_t id, size_t bytes) {
  std::string row(bytes, '\0');
  for (size_t i = 0; i < bytes; i += 8) row[i] = static_cast<char>(id * 31 + i / 8);
  row[bytes - 1] = static_cast<char>(id);
  return row;
}

// Whether p lies in a mapping of one of the database's table files.
bool InTableFileMapping(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2) continue;
    if (a >= lo && a < hi) return line.ends_with(".sst");
  }
  return false;
}

class SpillReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::MakeTempDir(test::TestTmpRoot(), "spillreader");
    ASSERT_TRUE(SpillStore::Open(dir_ + "/db", &store_).ok());
  }
  void TearDown() override {
    reader_.reset();
    store_.reset();
    test::RemoveTree(dir_);
  }
  // Rows first..first+n-1 of size(id) bytes.
  template <typename Size>
  void WriteRows(uint64_t first, uint64_t n, Size size) {
    for (uint64_t b = first; b < first + n; b += 64) {
      rocksdb::WriteBatch batch;
      uint64_t bytes = 0;
      for (uint64_t id = b; id < std::min(first + n, b + 64); ++id) {
        const std::string row = RowOf(id, size(id));
        SpillKey k(kCache, id);
        ASSERT_TRUE(batch.Put(k.slice(), row).ok());
        bytes += row.size();
      }
      Status s =
          store_->Write(&batch, bytes, SpillKey(kCache, std::min(first + n, b + 64) - 1));
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
  void OpenReader() { ASSERT_TRUE(SpillReader::Open(store_->path(), &reader_).ok()); }
  // Opens the reader once the store has flushed (it does once writes
  // stop): catching up, the reader then holds no row in its own memtable
  // (only the store's flush marker), and every row is read from a table
  // file.
  void OpenReaderOnTableFiles() {
    OpenReader();
    ASSERT_TRUE(test::WaitFor([&] {
      reader_->MaybeCatchUp();
      return reader_->MemtableRows() <= 1;
    })) << reader_->MemtableRows()
        << " rows still in the reader's memtables";
  }
  // Reads ids of `cache`, of the size given as the rows' expected one;
  // (*whole)[i]: row ids[i] was found and equal to want(ids[i]);
  // (*in_place)[i], when asked: it was handed over inside a mapping of a
  // table file.
  template <typename Size>
  void Read(const std::vector<uint64_t>& ids, size_t row_bytes, Size size,
            std::vector<bool>* whole, std::vector<bool>* found,
            std::vector<bool>* in_place = nullptr, uint32_t cache = kCache) {
    whole->assign(ids.size(), false);
    if (in_place) in_place->assign(ids.size(), false);
    std::unique_ptr<bool[]> got(new bool[ids.size()]());
    reader_->MultiGet(
        cache, ids, row_bytes,
        [&](size_t i, std::span<const std::byte> bytes) {
          const bool counted = counting;  // the check's own work is not counted
          counting = false;
          const std::string want = RowOf(ids[i], size(ids[i]));
          (*whole)[i] = bytes.size() == want.size() &&
                        std::equal(bytes.begin(), bytes.end(),
                                   reinterpret_cast<const std::byte*>(want.data()));
          if (in_place) (*in_place)[i] = InTableFileMapping(bytes.data());
          counting = counted;
        },
        std::span(got.get(), ids.size()));
    found->assign(got.get(), got.get() + ids.size());
  }

  std::string dir_;
  std::unique_ptr<SpillStore> store_;
  std::unique_ptr<SpillReader> reader_;
};

TEST_F(SpillReaderTest, RereadingSmallRowsAllocatesNoBufferPerRow) {
#ifdef SHMCACHE_TEST_UNDER_TSAN
  GTEST_SKIP() << "operator new is ThreadSanitizer's here: allocations are not counted";
#endif
  // 3 KB rows, as many as the store's memtables hold: the reader finds
  // them in the log it replays into its own memtable until the store's
  // flush once writes stop (kIdleFlushMs: on a loaded machine, before the
  // first read), then in a table file. Read from a table file, each row
  // also costs RocksDB a few small allocations of its own (the block, its
  // iterator, a status message: no block cache), so the buffers counted
  // are those a row's value fits in.
  const auto size = [](uint64_t) { return size_t{3} << 10; };
  const uint64_t n = (store_->memtables().bytes + 4 * kMB) / size(0);
  WriteRows(0, n, size);
  OpenReader();
  std::vector<uint64_t> ids(kBatch);
  std::vector<bool> whole, found;
  const auto spread = [&](int call) {  // the whole range
    for (size_t k = 0; k < kBatch; ++k)
      ids[k] = (static_cast<uint64_t>(call) * 7919 + k * (n / kBatch)) % n;
  };
  // Value buffers per call of kBatch rows, over kCalls calls; the first
  // call makes the thread's buffers. A reader opened while the store
  // flushed may have missed rows (the log it replays was removed after its
  // look at the manifest): a caller catches up and looks again, as
  // CacheImpl::FetchSpilled does.
  constexpr int kCalls = 20;
  const auto buffers_per_call = [&]() -> double {
    spread(0);
    EXPECT_TRUE(test::WaitFor([&] {
      Read(ids, size(0), size, &whole, &found);
      if (std::find(found.begin(), found.end(), false) == found.end()) return true;
      reader_->MaybeCatchUp();
      return false;
    })) << "rows not found after catching up";
    uint64_t counted = 0;
    for (int call = 1; call <= kCalls; ++call) {
      spread(call);
      // A call a second after the last catch-up catches up first, which
      // allocates: the reader catches up here, uncounted, so that the call
      // counted reads only.
      reader_->MaybeCatchUp();
      allocations = 0;
      counted_bytes = size(0);
      counting = true;
      Read(ids, size(0), size, &whole, &found);
      counting = false;
      counted += allocations;
      for (size_t k = 0; k < kBatch; ++k) {
        EXPECT_TRUE(found[k]) << "row " << ids[k];
        EXPECT_TRUE(whole[k]) << "row " << ids[k] << " not read back whole";
      }
    }
    return static_cast<double>(counted) / kCalls;
  };
  // A buffer per row would be at least kBatch per call (as before the
  // buffers were kept); what remains is RocksDB's own bookkeeping per call.
  const double first = buffers_per_call();  // the memtable, or a table file
  EXPECT_LT(first, kBatch / 4.0)
      << "row-sized allocations per call of " << kBatch << " rows of 3 KB: " << first;
  // Once the store has flushed, every row from a table file.
  ASSERT_TRUE(test::WaitFor([&] {
    reader_->MaybeCatchUp();
    return reader_->MemtableRows() <= 1;
  })) << reader_->MemtableRows()
      << " rows still in the reader's memtables";
  const double from_tables = buffers_per_call();
  EXPECT_LT(from_tables, kBatch / 4.0)
      << "row-sized allocations per call of " << kBatch
      << " rows of 3 KB from table files: " << from_tables;
}

TEST_F(SpillReaderTest, KeptBuffersNeverShowAFormerRowsBytes) {
  // Sizes that change from row to row: under, at and over the kept size,
  // and tiny, so each kept buffer is reused for rows shorter and longer
  // than the one before.
  const auto size = [](uint64_t id) -> size_t {
    switch (id % 4) {
      case 0: return 24;
      case 1: return size_t{3} << 10;
      case 2: return SpillReader::kKeptValueBytes;
      default: return SpillReader::kKeptValueBytes * 4 + 8;
    }
  };
  constexpr uint64_t kRows = 400;
  WriteRows(0, kRows, size);
  OpenReader();
  std::vector<bool> whole, found;
  for (int round = 0; round < 8; ++round) {
    // A batch over two chunks: ids asked twice, ids never written, rows of
    // every size at positions that differ from round to round.
    std::vector<uint64_t> ids;
    for (size_t k = 0; k < 2 * kBatch + 9; ++k) {
      if (k % 11 == 3) ids.push_back(kRows + 1000 + k);                 // not there
      else if (k % 13 == 5 && !ids.empty()) ids.push_back(ids[k / 2]);  // again
      else ids.push_back((static_cast<uint64_t>(round) * 37 + k * 5 + round * k) % kRows);
    }
    // Read as small rows (MultiGet), whose buffers are kept.
    Read(ids, size(1), size, &whole, &found);
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] >= kRows) {
        EXPECT_FALSE(found[k]) << "id " << ids[k] << " was never written";
        continue;
      }
      ASSERT_TRUE(found[k]) << "row " << ids[k] << ", round " << round;
      EXPECT_TRUE(whole[k]) << "row " << ids[k] << " (" << size(ids[k])
                            << " bytes) not read back whole, round " << round;
    }
  }
}

TEST_F(SpillReaderTest, LargeRowsAreReadInPlaceAndOnlyTheIdsAsked) {
  // Rows of twice the size from which the reader seeks, even ids only, in
  // more than one table file. A row of another cache after them.
  const auto size = [](uint64_t) { return SpillReader::kSeekRowBytes * 2; };
  const uint64_t n = 2 * ((store_->memtables().bytes + 4 * kMB) / size(0));
  for (uint64_t id = 0; id < n; id += 2) WriteRows(id, 1, size);
  {
    rocksdb::WriteBatch other;
    SpillKey k(kCache + 1, 1);
    ASSERT_TRUE(other.Put(k.slice(), RowOf(1, size(1))).ok());
    ASSERT_TRUE(store_->Write(&other, size(1), k).ok());
  }
  OpenReaderOnTableFiles();
  std::vector<uint64_t> ids(kBatch);
  for (int call = 0; call < 4; ++call) {
    // Rows there, ids between two rows (odd), ids past the last row (where
    // a seek lands on the other cache's row).
    for (size_t k = 0; k < kBatch; ++k)
      ids[k] = (static_cast<uint64_t>(call) * 7919 + k * (n / kBatch)) % n;
    ids[5] = 1;
    ids[9] = n + 1;
    ids[17] = n + 2;
    std::vector<bool> whole, got, in_place;
    Read(ids, size(0), size, &whole, &got, &in_place);
    for (size_t k = 0; k < kBatch; ++k) {
      if (ids[k] % 2 == 1 || ids[k] >= n) {
        EXPECT_FALSE(got[k]) << "id " << ids[k] << " was never written to this cache";
        continue;
      }
      ASSERT_TRUE(got[k]) << "row " << ids[k] << ", call " << call;
      ASSERT_TRUE(whole[k]) << "row " << ids[k] << " not read back whole, call " << call;
      EXPECT_TRUE(in_place[k]) << "row " << ids[k] << " was copied out of the table file";
    }
  }
}

TEST_F(SpillReaderTest, LargeRowsAreReadInPlaceWhateverTheCallsBeforeRead) {
  // A cache of rows about kSeekRowBytes: 48 KB and 96 KB in turn (72 KB on
  // average), read in batches of mostly the smaller rows (54 KB on
  // average) or mostly the larger, and between them a batch of another
  // cache's 3 KB rows through the same reader, as another thread reads.
  constexpr size_t kSmall = 48 << 10, kLarge = 96 << 10, kOther = 3 << 10;
  const auto size = [](uint64_t id) { return id % 2 == 0 ? kSmall : kLarge; };
  constexpr size_t kMean = (kSmall + kLarge) / 2;
  static_assert((kBatch * 7 / 8 * kSmall + kBatch / 8 * kLarge) / kBatch <
                SpillReader::kSeekRowBytes);
  const uint64_t n = 2 * ((store_->memtables().bytes + 4 * kMB) / kMean);
  WriteRows(0, n, size);
  rocksdb::WriteBatch other;
  for (uint64_t id = 0; id < kBatch; ++id) {
    SpillKey k(kCache + 1, id);
    ASSERT_TRUE(other.Put(k.slice(), RowOf(id, kOther)).ok());
  }
  ASSERT_TRUE(
      store_->Write(&other, kBatch * kOther, SpillKey(kCache + 1, kBatch - 1)).ok());
  OpenReaderOnTableFiles();
  std::vector<uint64_t> ids(kBatch);
  for (int call = 0; call < 9; ++call) {
    const bool others = call % 3 == 2;
    const uint32_t cache = others ? kCache + 1 : kCache;
    for (size_t k = 0; k < kBatch; ++k) {
      // Mostly even (small) ids in the first of each three calls, mostly
      // odd in the second; 7 in 8 of them.
      const uint64_t odd = (k % 8 == 0) == (call % 3 == 0) ? 1 : 0;
      ids[k] = others
                   ? k
                   : ((static_cast<uint64_t>(call) * 7919 + k * 97) % (n / 2)) * 2 + odd;
    }
    const auto sized = [&](uint64_t id) { return others ? kOther : size(id); };
    std::vector<bool> whole, got, in_place;
    Read(ids, others ? kOther : kMean, sized, &whole, &got, &in_place, cache);
    size_t copied = 0;
    for (size_t k = 0; k < kBatch; ++k) {
      ASSERT_TRUE(got[k]) << "row " << ids[k] << " of cache " << cache << ", call "
                          << call;
      ASSERT_TRUE(whole[k]) << "row " << ids[k] << " not read back whole, call " << call;
      copied += in_place[k] ? 0 : 1;
    }
    if (!others) {
      EXPECT_EQ(copied, 0u) << "rows copied out of the table files, call " << call;
    }
  }
}

TEST_F(SpillReaderTest, ACorruptRowIsLeftToTheCallerByBothPathsAndTheOthersRead) {
  // A real cause of a read error: one large row's block changed in its
  // table file (a bit flipped on the disk), so that its checksum fails.
  const auto size = [](uint64_t) { return SpillReader::kSeekRowBytes * 2; };
  const uint64_t n = 2 * ((store_->memtables().bytes + 4 * kMB) / size(0));
  WriteRows(0, n, size);
  OpenReaderOnTableFiles();
  std::vector<uint64_t> ids(kBatch);
  for (size_t k = 0; k < kBatch; ++k) ids[k] = k * (n / kBatch);
  const uint64_t bad = ids[kBatch / 2];
  // The row's value in a table file: its key, the 8 bytes RocksDB adds to
  // it, then the row.
  const SpillKey key(kCache, bad);
  const std::string row = RowOf(bad, size(bad));
  const std::string stored = key.slice().ToString();
  int corrupted = 0;
  for (const auto& e : std::filesystem::directory_iterator(store_->path())) {
    if (e.path().extension() != ".sst") continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string table((std::istreambuf_iterator<char>(in)), {});
    for (size_t at = table.find(row); at != std::string::npos;
         at = table.find(row, at + 1)) {
      if (at < stored.size() + 8 ||
          table.compare(at - 8 - stored.size(), stored.size(), stored) != 0)
        continue;
      std::fstream out(e.path(), std::ios::binary | std::ios::in | std::ios::out);
      out.seekp(static_cast<std::streamoff>(at + row.size() / 2));
      out.put(static_cast<char>(table[at + row.size() / 2] ^ 0x20));
      ASSERT_TRUE(out.good()) << e.path();
      ++corrupted;
    }
  }
  ASSERT_EQ(corrupted, 1) << "row " << bad << "'s value found in " << corrupted
                          << " places";
  // MultiGet (the rows' expected size 0) and seeks, twice each: the bad row
  // is not got (the caller asks the daemon), every other row reads whole,
  // before and after it in the call.
  for (const size_t row_bytes : {size_t{0}, size(0), size_t{0}, size(0)}) {
    std::vector<bool> whole, found;
    Read(ids, row_bytes, size, &whole, &found);
    for (size_t k = 0; k < kBatch; ++k) {
      if (ids[k] == bad) {
        EXPECT_FALSE(found[k]) << "corrupt row " << bad << " read, row_bytes "
                               << row_bytes;
        continue;
      }
      ASSERT_TRUE(found[k]) << "row " << ids[k] << ", row_bytes " << row_bytes;
      EXPECT_TRUE(whole[k]) << "row " << ids[k] << ", row_bytes " << row_bytes;
    }
  }
}

}  // namespace
}  // namespace shmcache
