// BatchReader: rows read straight into batch buffers by worker threads.
#include "shmcache/batch_reader.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "shmcache/client.h"
#include "tests/support/sanitizer.h"
#include "tests/support/test_server.h"

// Allocations through operator new, counted per thread, and the one of a
// thread's that is made to fail (bad_alloc, as under a memory limit).
// ThreadSanitizer's runtime defines operator new itself (a second
// definition does not link): there the test that fails one is skipped.
namespace {
thread_local long allocations = 0;
thread_local long fail_allocation = 0;  // 0: none
}  // namespace

#ifndef SHMCACHE_TEST_UNDER_TSAN
// Not inlined, nor the deletes: GCC took an inlined malloc and free for a
// new and delete that do not match (-Wmismatched-new-delete).
[[gnu::noinline]] void* operator new(size_t n) {
  if (++allocations == fail_allocation) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, size_t) noexcept { std::free(p); }
#endif

namespace shmcache::test {
namespace {

// 4 KB rows: a batch of a few hundred is large enough for BatchReader to
// split it among its threads.
constexpr int64_t kImgShape[] = {64, 64};
constexpr size_t kImgBytes = size_t{64} * 64;
constexpr uint8_t kUntouched = 0xAB;

std::unique_ptr<Cache> OpenCache(const TestServer& server, uint32_t session,
                                 uint64_t size_mb = 0, bool spilling = false) {
  std::unique_ptr<Client> client;
  EXPECT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(CacheNamed(session, "batches", size_mb, spilling), &cache);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return cache;
}

// Row id: an "img" column (uint8 of `shape`, the id's pattern) and a
// "label" scalar of `label_type` holding the id.
Status PutRow(Cache* cache, uint64_t id, std::span<const int64_t> shape = kImgShape,
              DType label_type = DType::kInt64) {
  std::vector<uint8_t> img = Pattern(id, 1, kImgBytes);
  int64_t label = static_cast<int64_t>(id);
  ColumnRef cols[2] = {
      {"img", DType::kUInt8, shape, img.data(), img.size()},
      {"label", label_type, {}, &label, DTypeSize(label_type)},
  };
  return cache->Put(id, cols);
}

// Batch buffers with every byte kUntouched, and the targets over them.
struct Batch {
  explicit Batch(size_t n) : img(n * kImgBytes, kUntouched), label(n, -1), hit(n, 7) {
    targets[0] = {"img", DType::kUInt8, kImgShape, img.data(), kImgBytes};
    targets[1] = {"label", DType::kInt64, {}, label.data(), sizeof(int64_t)};
  }
  bool RowIs(size_t i, uint64_t id) const {
    return std::memcmp(&img[i * kImgBytes], Pattern(id, 1, kImgBytes).data(),
                       kImgBytes) == 0 &&
           label[i] == static_cast<int64_t>(id);
  }
  bool RowUntouched(size_t i) const {
    for (size_t k = 0; k < kImgBytes; ++k) {
      if (img[i * kImgBytes + k] != kUntouched) return false;
    }
    return label[i] == -1;
  }
  std::vector<uint8_t> img;
  std::vector<int64_t> label;
  std::vector<uint8_t> hit;
  ColumnTarget targets[2];
};

class BatchReaderTest : public ::testing::TestWithParam<int> {};

TEST_P(BatchReaderTest, HitsMissesAndMismatchedRows) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  const int64_t wide[] = {32, 128};
  for (uint64_t id = 0; id < 300; ++id) {
    if (id % 7 == 0) continue;  // a miss
    Status s = id == 50   ? PutRow(cache.get(), id, wide)
               : id == 60 ? PutRow(cache.get(), id, kImgShape, DType::kInt32)
                          : PutRow(cache.get(), id);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Ids in a shuffled order, one repeated; batch position i gets ids[i].
  std::vector<uint64_t> ids;
  for (uint64_t k = 0; k < 300; ++k) ids.push_back((k * 113) % 300);
  ids.push_back(113);
  BatchReader reader(cache.get(), GetParam());
  Batch b(ids.size());
  Status s = reader.ReadInto(ids, b.targets, b.hit);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < ids.size(); ++i) {
    bool want = ids[i] % 7 != 0 && ids[i] != 50 && ids[i] != 60;
    uint8_t code = want ? kRowRead : ids[i] % 7 == 0 ? kRowMissing : kRowOtherLayout;
    ASSERT_EQ(b.hit[i], code) << "id " << ids[i];
    if (want) {
      EXPECT_TRUE(b.RowIs(i, ids[i])) << "id " << ids[i];
    } else {
      EXPECT_TRUE(b.RowUntouched(i)) << "id " << ids[i];
    }
  }
  // Reused for a second batch, and for an empty one.
  Batch again(2);
  std::vector<uint64_t> two = {1, 2};
  ASSERT_TRUE(reader.ReadInto(two, again.targets, again.hit).ok());
  EXPECT_TRUE(again.hit[0] && again.hit[1] && again.RowIs(0, 1) && again.RowIs(1, 2));
  ASSERT_TRUE(reader.ReadInto({}, again.targets, {}).ok());
}

INSTANTIATE_TEST_SUITE_P(Threads, BatchReaderTest, ::testing::Values(0, 1, 3));

// A column stored as "label" + kNumberSuffix (the Python package's Python
// int) is read into the target "label"; one with another suffix is not.
TEST(BatchReaderNameTest, ANumberColumnAnswersItsPlainName) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  const std::string number = "label" + std::string(kNumberSuffix);
  const std::string other = "label\x1fRGB";
  for (uint64_t id = 1; id <= 2; ++id) {
    std::vector<uint8_t> img = Pattern(id, 1, kImgBytes);
    auto label = static_cast<int64_t>(id);
    ColumnRef cols[2] = {
        {"img", DType::kUInt8, kImgShape, img.data(), img.size()},
        {id == 1 ? number : other, DType::kInt64, {}, &label, sizeof label},
    };
    ASSERT_TRUE(cache->Put(id, cols).ok());
  }
  BatchReader reader(cache.get(), 0);
  Batch b(2);
  std::vector<uint64_t> ids = {1, 2};
  ASSERT_TRUE(reader.ReadInto(ids, b.targets, b.hit).ok());
  EXPECT_EQ(b.hit[0], kRowRead);
  EXPECT_TRUE(b.RowIs(0, 1));
  EXPECT_EQ(b.hit[1], kRowOtherLayout);
  EXPECT_TRUE(b.RowUntouched(1));
}

// Each stored dtype a target takes (Takes): its own; the same bytes for a
// kSameBytes target; uint16 / uint32 widened and uint64's bits for a kTorch
// target. A kExact target takes none of the others.
TEST(BatchReaderDTypeTest, TargetsTakeTheirDTypesAndWidenTorchOnes) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  const int64_t three[] = {3};
  const uint64_t big = (uint64_t{1} << 63) + 5;
  for (uint64_t id = 0; id < 4; ++id) {
    uint16_t u16[3] = {static_cast<uint16_t>(60000 + id), 1, 2};
    uint32_t u32[3] = {static_cast<uint32_t>(4000000000u + id), 3, 4};
    uint64_t u64[3] = {big + id, 5, 6};
    uint16_t bf16[3] = {0x3f80, 0x4000, static_cast<uint16_t>(id)};
    const char blob[3] = {'a', 'b', static_cast<char>('0' + id)};
    ColumnRef cols[] = {
        {"u16", DType::kUInt16, three, u16, sizeof(u16)},
        {"u32", DType::kUInt32, three, u32, sizeof(u32)},
        {"u64", DType::kUInt64, three, u64, sizeof(u64)},
        {"bf16", DType::kBFloat16, three, bf16, sizeof(bf16)},
        {"blob", DType::kBytes, three, blob, sizeof(blob)},
    };
    ASSERT_TRUE(cache->Put(id, cols).ok());
  }
  std::vector<uint64_t> ids = {3, 0, 2, 1};
  std::vector<int32_t> i32(12, -1);
  std::vector<int64_t> i64a(12, -1), i64b(12, -1);
  std::vector<uint16_t> raw(12, 0);
  std::vector<uint8_t> bytes(12, 0);
  ColumnTarget targets[] = {
      {"u16", DType::kInt32, three, i32.data(), 12, Accept::kTorch},
      {"u32", DType::kInt64, three, i64a.data(), 24, Accept::kTorch},
      {"u64", DType::kInt64, three, i64b.data(), 24, Accept::kTorch},
      {"bf16", DType::kUInt16, three, raw.data(), 6, Accept::kSameBytes},
      {"blob", DType::kUInt8, three, bytes.data(), 3, Accept::kSameBytes},
  };
  BatchReader reader(cache.get(), 2);
  std::vector<uint8_t> hit(ids.size());
  ASSERT_TRUE(reader.ReadInto(ids, targets, hit).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(hit[i], kRowRead) << i;
    EXPECT_EQ(i32[3 * i], static_cast<int32_t>(60000 + ids[i]));
    EXPECT_EQ(i32[3 * i + 2], 2);
    EXPECT_EQ(i64a[3 * i], static_cast<int64_t>(4000000000u + ids[i]));
    EXPECT_EQ(i64b[3 * i], static_cast<int64_t>(big + ids[i]));  // its bits: wraps
    EXPECT_EQ(raw[3 * i + 2], ids[i]);
    EXPECT_EQ(bytes[3 * i + 2], '0' + ids[i]);
  }
  // One target each that takes nothing but its own dtype: every row is
  // cached but not taken, and nothing is written.
  std::fill(i32.begin(), i32.end(), -1);
  std::fill(i64a.begin(), i64a.end(), -1);
  std::fill(i64b.begin(), i64b.end(), -1);
  std::fill(raw.begin(), raw.end(), 0);
  std::fill(bytes.begin(), bytes.end(), 0);
  for (int t = 0; t < 5; ++t) {
    ColumnTarget other = targets[t];
    other.accept = t < 3 ? Accept::kSameBytes : Accept::kTorch;
    std::fill(hit.begin(), hit.end(), 9);
    ASSERT_TRUE(reader.ReadInto(ids, std::span(&other, 1), hit).ok());
    EXPECT_EQ(hit, std::vector<uint8_t>(ids.size(), kRowOtherLayout)) << t;
  }
  EXPECT_EQ(i32, std::vector<int32_t>(12, -1));
  EXPECT_EQ(i64a, std::vector<int64_t>(12, -1));
  EXPECT_EQ(i64b, std::vector<int64_t>(12, -1));
  EXPECT_EQ(raw, std::vector<uint16_t>(12, 0));
  EXPECT_EQ(bytes, std::vector<uint8_t>(12, 0));
  EXPECT_TRUE(Takes(DType::kFloat32, Accept::kExact, DType::kFloat32));
  EXPECT_FALSE(Takes(DType::kInt32, Accept::kExact, DType::kUInt16));
  EXPECT_FALSE(Takes(DType::kInt64, Accept::kTorch, DType::kUInt16));
  EXPECT_FALSE(Takes(DType::kUInt8, Accept::kTorch, DType::kBytes));
}

// `stored` says how the first cached row that has each target's column
// stores it, whether or not the row matched; a column no row has: kNoRow.
TEST(BatchReaderStoredTest, ReportsHowTheFirstCachedRowStoresEachColumn) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  const int64_t wide[] = {32, 128};
  for (uint64_t id = 1; id < 400; ++id) {
    ASSERT_TRUE(
        (id == 7 ? PutRow(cache.get(), id, wide, DType::kInt32) : PutRow(cache.get(), id))
            .ok());
  }
  // Position 0 is a miss, 1 holds row 7 (another layout), the rest match;
  // 400 rows of 4 KB: several threads share the batch.
  std::vector<uint64_t> ids = {0, 7};
  for (uint64_t id = 1; id < 400; ++id) ids.push_back(id);
  Batch b(ids.size());
  ColumnTarget with_extra[3] = {
      b.targets[0], b.targets[1], {"none", DType::kUInt8, {}, b.img.data(), 1}};
  BatchReader reader(cache.get(), 3);
  std::vector<StoredColumn> stored(3);
  ASSERT_TRUE(
      reader.ReadInto(ids, std::span(with_extra, 2), b.hit, std::span(stored.data(), 2))
          .ok());
  EXPECT_EQ(b.hit[0], kRowMissing);
  EXPECT_EQ(b.hit[1], kRowOtherLayout);
  EXPECT_EQ(stored[0].row, 1u);
  EXPECT_EQ(stored[0].dtype, DType::kUInt8);
  EXPECT_EQ(stored[0].shape, std::vector<int64_t>(std::begin(wide), std::end(wide)));
  EXPECT_EQ(stored[1].row, 1u);
  EXPECT_EQ(stored[1].dtype, DType::kInt32);
  EXPECT_TRUE(stored[1].shape.empty());
  // Without the odd row, and with a column no row has (nothing hits).
  std::vector<uint64_t> rest(ids.begin() + 2, ids.end());
  Batch c(rest.size());
  ASSERT_TRUE(reader.ReadInto(rest, with_extra, c.hit, stored).ok());
  EXPECT_EQ(c.hit, std::vector<uint8_t>(rest.size(), kRowOtherLayout));
  EXPECT_EQ(stored[0].row, 0u);
  EXPECT_EQ(stored[0].shape,
            std::vector<int64_t>(std::begin(kImgShape), std::end(kImgShape)));
  EXPECT_EQ(stored[1].dtype, DType::kInt64);
  EXPECT_EQ(stored[2].row, StoredColumn::kNoRow);
  // A stored span of another length is refused, with nothing read.
  EXPECT_TRUE(reader.ReadInto(rest, with_extra, c.hit, std::span(stored.data(), 1))
                  .IsInvalidArgument());
}

// Every id of a batch is counted once: a hit for each cached row (matched
// or not), a miss for each absent one.
TEST(BatchReaderStatsTest, EachRowIsCountedOnce) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  const int64_t wide[] = {32, 128};
  for (uint64_t id = 0; id < 300; ++id) {
    if (id % 3 == 0) continue;
    ASSERT_TRUE((id == 4 ? PutRow(cache.get(), id, wide) : PutRow(cache.get(), id)).ok());
  }
  CacheStats before;
  ASSERT_TRUE(cache->GetStats(&before).ok());
  std::vector<uint64_t> ids(300);
  for (uint64_t id = 0; id < 300; ++id) ids[id] = id;
  BatchReader reader(cache.get(), 3);
  Batch b(ids.size());
  std::vector<StoredColumn> stored(2);
  ASSERT_TRUE(reader.ReadInto(ids, b.targets, b.hit, stored).ok());
  CacheStats after;
  ASSERT_TRUE(cache->GetStats(&after).ok());
  EXPECT_EQ(after.hits - before.hits, 200u);
  EXPECT_EQ(after.misses - before.misses, 100u);
}

// A 1 MB spilling cache holding rows 0..kRows-1, ~4 MB of them: most spill,
// some stay in memory; `ids` asks for kRows (a miss) and then every row.
class BatchReaderSpillTest : public ::testing::Test {
 protected:
  static constexpr size_t kRows = 1000;

  void SetUp() override {
    spill_ = MakeTempDir(TestTmpRoot(), "spill");
    server_ = std::make_unique<TestServer>(WithArgs({"-s", spill_}));
    ASSERT_TRUE(server_->ok()) << server_->start_result().Describe();
    cache = OpenCache(*server_, server_->NewSession(), 1, true);
    ASSERT_TRUE(cache);
    for (uint64_t id = 0; id < kRows; ++id) ASSERT_TRUE(PutRow(cache.get(), id).ok());
    CacheStats st;
    ASSERT_TRUE(cache->GetStats(&st).ok());
    ASSERT_GT(st.disk_rows, 0u);
    ASSERT_GT(st.mem_rows, 0u);
    ids.resize(kRows + 1);
    for (uint64_t id = 0; id < kRows + 1; ++id) ids[id] = kRows - id;
  }

  void TearDown() override {
    cache.reset();
    server_.reset();
    if (!spill_.empty()) RemoveTree(spill_);
  }

  std::unique_ptr<Cache> cache;
  std::vector<uint64_t> ids;

 private:
  std::string spill_;
  std::unique_ptr<TestServer> server_;
};

// count=false reads as a counted read does and counts nothing, memory and
// spilled rows alike (a loader's read-back of rows its workers stored after
// its own counted read missed them); ViewBatchUncounted likewise.
TEST_F(BatchReaderSpillTest, AnUncountedReadReadsTheSameRowsAndCountsNothing) {
  BatchReader reader(cache.get(), 2);
  Batch b(ids.size());
  CacheStats before;
  ASSERT_TRUE(cache->GetStats(&before).ok());
  ASSERT_TRUE(reader.ReadInto(ids, b.targets, b.hit, {}, false).ok());
  EXPECT_EQ(b.hit[0], kRowMissing);
  EXPECT_TRUE(b.RowUntouched(0));
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_EQ(b.hit[i], kRowRead) << "id " << ids[i];
    ASSERT_TRUE(b.RowIs(i, ids[i])) << "id " << ids[i];
  }
  std::vector<RowView> views(ids.size());
  std::vector<Status> statuses(ids.size());
  ASSERT_TRUE(cache->ViewBatchUncounted(ids, views, statuses).ok());
  EXPECT_TRUE(statuses[0].IsNotFound());
  CacheStats after;
  ASSERT_TRUE(cache->GetStats(&after).ok());
  EXPECT_EQ(after.hits, before.hits);
  EXPECT_EQ(after.misses, before.misses);
  Batch counted(ids.size());
  ASSERT_TRUE(reader.ReadInto(ids, counted.targets, counted.hit).ok());
  ASSERT_TRUE(cache->GetStats(&after).ok());
  EXPECT_EQ(after.hits - before.hits, kRows);
  EXPECT_EQ(after.misses - before.misses, 1u);
  EXPECT_TRUE(cache->ViewBatchUncounted(ids, std::span(views).first(2), statuses)
                  .IsInvalidArgument());
}

// Readers of their own in several threads, while a writer adds rows: every
// hit is a whole, right row; rows written before the reads began are hits.
TEST(BatchReaderConcurrencyTest, ReadersInThreadsWhileAWriterPuts) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  const uint64_t kBefore = 400, kAll = 1200;
  for (uint64_t id = 0; id < kBefore; ++id) ASSERT_TRUE(PutRow(cache.get(), id).ok());
  std::atomic<bool> bad{false};
  std::thread writer([&] {
    for (uint64_t id = kBefore; id < kAll; ++id) {
      if (!PutRow(cache.get(), id).ok()) bad = true;
    }
  });
  std::vector<std::thread> readers;
  readers.reserve(3);
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      BatchReader reader(cache.get(), 2);
      std::vector<uint64_t> ids(kAll);
      for (int round = 0; round < 5; ++round) {
        for (uint64_t k = 0; k < kAll; ++k) ids[k] = (k * 7 + r + round) % kAll;
        Batch b(ids.size());
        if (!reader.ReadInto(ids, b.targets, b.hit).ok()) bad = true;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (b.hit[i] ? !b.RowIs(i, ids[i]) : (ids[i] < kBefore || !b.RowUntouched(i))) {
            bad = true;
          }
        }
      }
    });
  }
  writer.join();
  for (std::thread& t : readers) t.join();
  EXPECT_FALSE(bad.load());
}

TEST_F(BatchReaderSpillTest, SpilledRowsAreReadWithTheMemoryRows) {
  BatchReader reader(cache.get(), 2);
  Batch b(ids.size());
  ASSERT_TRUE(reader.ReadInto(ids, b.targets, b.hit).ok());
  EXPECT_EQ(b.hit[0], 0);
  EXPECT_TRUE(b.RowUntouched(0));
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_EQ(b.hit[i], 1) << "id " << ids[i];
    ASSERT_TRUE(b.RowIs(i, ids[i])) << "id " << ids[i];
  }
}

// A cache closed (InvalidArgument) or whose session was destroyed
// (NotFound): the error, and no hits (cache.h's common errors).
TEST(BatchReaderErrorTest, AnUnusableCacheIsAnErrorWithNoHits) {
  for (bool close : {true, false}) {
    TestServer server;
    ASSERT_TRUE(server.ok());
    const uint32_t session = server.NewSession();
    auto cache = OpenCache(server, session);
    ASSERT_TRUE(cache);
    ASSERT_TRUE(PutRow(cache.get(), 1).ok());
    BatchReader reader(cache.get(), 2);
    std::unique_ptr<Client> client;
    ASSERT_TRUE(server.Connect(&client).ok());
    if (close) {
      cache->Close();
    } else {
      ASSERT_TRUE(client->DestroySession(session).ok());
    }
    Batch b(3);
    std::vector<uint64_t> ids = {1, 1, 1};
    Status s = reader.ReadInto(ids, b.targets, b.hit);
    EXPECT_TRUE(close ? s.IsInvalidArgument() : s.IsNotFound()) << s.ToString();
    EXPECT_EQ(b.hit, std::vector<uint8_t>(3, 0));
  }
}

// Outputs of another length than the ids (hit) or the targets (stored) are
// refused before anything is read, written or counted.
TEST(BatchReaderErrorTest, OutputsOfAnotherLengthAreInvalidArgumentsAndNothingIsRead) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  ASSERT_TRUE(PutRow(cache.get(), 1).ok());
  BatchReader reader(cache.get(), 2);
  std::vector<uint64_t> ids = {1, 1, 1};
  Batch b(3);
  std::vector<uint8_t> short_hit(2, 7);
  Status s = reader.ReadInto(ids, b.targets, short_hit);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(short_hit, std::vector<uint8_t>(2, 7));
  std::vector<StoredColumn> one(1);
  s = reader.ReadInto(ids, b.targets, b.hit, one);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(one[0].row, StoredColumn::kNoRow);
  EXPECT_EQ(b.hit, std::vector<uint8_t>(3, 7));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(b.RowUntouched(i)) << i;
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.hits + st.misses, 0u) << "nothing was read";
}

// num_threads counts the calling thread: 0 or 1 (or less) is it alone.
TEST(BatchReaderThreadsTest, NumThreadsCountsTheCaller) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  for (int n : {-3, 0, 1}) EXPECT_EQ(BatchReader(cache.get(), n).num_threads(), 1) << n;
  EXPECT_EQ(BatchReader(cache.get(), 4).num_threads(), 4);
}

// The bytes of this process's address space (VmSize).
size_t AddressSpaceBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmSize:")) return std::stoull(line.substr(7)) << 10;
  }
  return 0;
}

// A cache of `server` with rows 0 to n - 1 (PutRow's), and their ids.
void CacheRows(const TestServer& server, uint64_t n, std::unique_ptr<Cache>* cache,
               std::vector<uint64_t>* ids) {
  ASSERT_TRUE(server.ok());
  *cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(*cache);
  ids->resize(n);
  for (uint64_t id = 0; id < n; ++id) {
    ASSERT_TRUE(PutRow(cache->get(), id).ok()) << id;
    (*ids)[id] = id;
  }
}

// A system that refuses threads (here an address space limit with room for
// two of the fifteen helper stacks asked; elsewhere a process limit) gets a
// reader with the helpers it could start, which reads as any other. The
// refusal used to end the process: the constructor's exception destroyed
// the helpers already started while joinable ("terminate called without an
// active exception").
TEST(BatchReaderThreadsTest, HelpersTheSystemRefusesAreDoneWithout) {
  TestServer server;
  std::unique_ptr<Cache> cache;
  std::vector<uint64_t> ids;
  ASSERT_NO_FATAL_FAILURE(CacheRows(server, 300, &cache, &ids));
  pid_t pid = ForkChild([&] {
    Batch b(ids.size());
    pthread_attr_t attr;
    size_t stack = 0;
    if (pthread_getattr_default_np(&attr) != 0 ||
        pthread_attr_getstacksize(&attr, &stack) != 0 || stack == 0) {
      return 2;
    }
    rlim_t room = AddressSpaceBytes() + 2 * stack + stack / 2;
    rlimit limit{room, room};
    if (setrlimit(RLIMIT_AS, &limit) != 0) return 2;
    BatchReader reader(cache.get(), 16);
    if (reader.num_threads() < 1 || reader.num_threads() >= 16) return 3;
    if (!reader.ReadInto(ids, b.targets, b.hit).ok()) return 4;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (b.hit[i] != kRowRead || !b.RowIs(i, ids[i])) return 5;
    }
    return 0;
  });
  EXPECT_EQ(WaitChild(pid), 0);
}

// A helper whose thread's state cannot be allocated (bad_alloc, as under a
// memory limit: std::thread allocates it before it asks for the thread) is
// one helper less, as a thread the system refuses is. Its exception left
// the constructor with the helpers started still joinable, which ended the
// process ("terminate called without an active exception").
TEST(BatchReaderThreadsTest, AHelperWhoseStateCannotBeAllocatedIsDoneWithout) {
#ifdef SHMCACHE_TEST_UNDER_TSAN
  GTEST_SKIP() << "operator new is ThreadSanitizer's here: no allocation can be failed";
#endif
  TestServer server;
  std::unique_ptr<Cache> cache;
  std::vector<uint64_t> ids;
  ASSERT_NO_FATAL_FAILURE(CacheRows(server, 300, &cache, &ids));
  // The constructor's allocations in this thread (after a first one, which
  // may make what a process makes once): its last is the last helper's
  // thread state.
  { BatchReader first(cache.get(), 4); }
  allocations = 0;
  long made = 0;
  {
    BatchReader reader(cache.get(), 4);
    made = allocations;
    ASSERT_EQ(reader.num_threads(), 4);
  }
  ASSERT_GE(made, 3);
  pid_t pid = ForkChild([&] {
    Batch b(ids.size());
    allocations = 0;
    fail_allocation = made;
    BatchReader reader(cache.get(), 4);
    fail_allocation = 0;
    if (reader.num_threads() != 3) return 3;
    if (!reader.ReadInto(ids, b.targets, b.hit).ok()) return 4;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (b.hit[i] != kRowRead || !b.RowIs(i, ids[i])) return 5;
    }
    return 0;
  });
  EXPECT_EQ(WaitChild(pid), 0);
}

TEST(BatchReaderForkTest, AForkedChildReadsWithItsOwnThreads) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  auto cache = OpenCache(server, server.NewSession());
  ASSERT_TRUE(cache);
  for (uint64_t id = 0; id < 300; ++id) ASSERT_TRUE(PutRow(cache.get(), id).ok());
  BatchReader reader(cache.get(), 3);
  std::vector<uint64_t> ids(300);
  for (uint64_t id = 0; id < 300; ++id) ids[id] = id;
  Batch parent(ids.size());
  ASSERT_TRUE(reader.ReadInto(ids, parent.targets, parent.hit).ok());
  pid_t pid = ForkChild([&] {
    Batch b(ids.size());
    if (!reader.ReadInto(ids, b.targets, b.hit).ok()) return 2;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!b.hit[i] || !b.RowIs(i, ids[i])) return 3;
    }
    return 0;
  });
  EXPECT_EQ(WaitChild(pid), 0);
}

}  // namespace
}  // namespace shmcache::test
