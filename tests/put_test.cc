// Cache::Put (cache_put.cc): the first writer of an id wins, in one process
// and across processes; a full cache refuses rows and keeps serving those
// it holds. A real daemon per test (integration_fixture.h).
#include <unistd.h>

#include <vector>

#include <gtest/gtest.h>

#include "tests/support/child_process.h"
#include "tests/support/integration_fixture.h"

namespace shmcache::test {
namespace {

// A cache of 8 MB filled with rows 0, 1, ... of kRowBytes until one was
// refused (refused_).
class FullCacheTest : public IntegrationTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(IntegrationTest::SetUp());
    Attach(&client_, &cache_, "small", /*size_mb=*/8);
    Status s;
    for (refused_ = 0; refused_ < 10000; ++refused_) {
      s = PutPattern(*cache_, refused_, 0, kRowBytes);
      if (!s.ok()) break;
    }
    ASSERT_TRUE(s.IsFull()) << s.ToString();
  }
  std::unique_ptr<Client> client_;
  std::unique_ptr<Cache> cache_;
  uint64_t refused_ = 0;
};

TEST_F(IntegrationTest, FirstWriterWinsInOneProcess) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  bool inserted = false;
  ASSERT_TRUE(PutPattern(*cache, 7, /*salt=*/1, kRowBytes, &inserted).ok());
  EXPECT_TRUE(inserted);
  ASSERT_TRUE(PutPattern(*cache, 7, /*salt=*/2, kRowBytes / 2, &inserted).ok());
  EXPECT_FALSE(inserted) << "the second copy is dropped without error";
  Row row;
  ASSERT_TRUE(cache->Get(7, &row).ok());
  EXPECT_TRUE(RowMatches(row, 7, 1, kRowBytes));
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, 1u);
}

// Processes race to put the same ids with different contents. Every reader
// agrees on one whole copy per id, one of the written ones.
TEST_F(IntegrationTest, FirstWriterWinsAcrossProcesses) {
  constexpr int kProcs = 4;
  constexpr uint64_t kRows = 1500;
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    kids.push_back(ForkChild([&, p]() -> int {
      close(ready[0]);
      close(go[1]);
      std::unique_ptr<Client> client;
      if (!server_->Connect(&client).ok()) return 2;
      std::unique_ptr<Cache> cache;
      if (!client->OpenCache(Options(session_), &cache).ok()) return 3;
      char c = 'r';
      if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 0) return 4;
      for (uint64_t id = 0; id < kRows; ++id) {
        if (!PutPattern(*cache, id, /*salt=*/p + 1, kRowBytes).ok()) return 5;
      }
      return 0;
    }));
  }
  close(ready[1]);
  close(go[0]);
  char c;
  for (int p = 0; p < kProcs; ++p) ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(go[1]);  // EOF releases every child at once
  for (pid_t k : kids) EXPECT_EQ(WaitChild(k), 0);
  close(ready[0]);

  std::vector<int> winner(kRows, -1);
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  Row row;
  for (uint64_t id = 0; id < kRows; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok());
    for (int p = 0; p < kProcs; ++p) {
      if (RowMatches(row, id, p + 1, kRowBytes, true)) winner[id] = p;
    }
    ASSERT_NE(winner[id], -1) << "row " << id << " is nobody's whole copy";
  }
  // Other processes read the same winners.
  pid_t kid = ForkChild([&]() -> int {
    std::unique_ptr<Client> c2;
    if (!server_->Connect(&c2).ok()) return 2;
    std::unique_ptr<Cache> k2;
    if (!c2->OpenCache(Options(session_), &k2).ok()) return 3;
    Row r;
    for (uint64_t id = 0; id < kRows; ++id) {
      if (!k2->Get(id, &r).ok() || !RowMatches(r, id, winner[id] + 1, kRowBytes))
        return 4;
    }
    return 0;
  });
  EXPECT_EQ(WaitChild(kid), 0);
}

TEST_F(FullCacheTest, RefusesRowsAndKeepsServing) {
  Cache* cache = cache_.get();
  const uint64_t id = refused_;
  EXPECT_TRUE(cache->IsFull());
  EXPECT_GT(id, 2000u) << "most of 8 MB holds 3 KB rows";
  Row row;
  for (uint64_t i = 0; i < id; ++i) {
    ASSERT_TRUE(cache->Get(i, &row).ok()) << i;
    ASSERT_TRUE(RowMatches(row, i, 0, kRowBytes));
  }
  // A row of the size refused is refused again. (A smaller one that fits
  // the room left in this process's chunk would be stored: a full cache
  // leases no chunk, but the ones leased are filled.)
  EXPECT_TRUE(PutPattern(*cache, id + 1, 0, kRowBytes).IsFull());
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_TRUE(st.full);
  EXPECT_LE(st.mem_bytes, st.budget_bytes);
}

// A put of an id already cached is a success that stores nothing (the
// first writer wins, cache.h), in a full cache as in any other: it is no
// refusal, counts in no puts_full and ends no batch. A batch that puts
// rows the cache holds beside new ones (a DataLoader worker putting back
// a batch another worker stored) is refused only for the new ones.
TEST_F(FullCacheTest, ARowAlreadyCachedIsPutAsOk) {
  Cache* cache = cache_.get();
  const uint64_t refused = refused_;
  CacheStats before;
  ASSERT_TRUE(cache->GetStats(&before).ok());
  ASSERT_TRUE(before.full);

  bool inserted = true;
  Status s = PutPattern(*cache, 0, 0, kRowBytes, &inserted);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(inserted);

  // Cached, cached, new: only the new one is refused.
  const std::vector<uint64_t> ids{1, 2, refused};
  std::vector<uint8_t> bytes(kRowBytes, 7);
  const int64_t shape = static_cast<int64_t>(bytes.size());
  const ColumnRef col{"data", DType::kUInt8, std::span(&shape, 1), bytes.data(),
                      bytes.size()};
  const std::vector<std::span<const ColumnRef>> rows(ids.size(), std::span(&col, 1));
  std::vector<Status> statuses(ids.size());
  bool added[3] = {true, true, true};
  ASSERT_TRUE(cache->PutBatch(ids, rows, statuses, added).ok());
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].ToString();
  EXPECT_TRUE(statuses[1].ok()) << statuses[1].ToString();
  EXPECT_TRUE(statuses[2].IsFull()) << statuses[2].ToString();
  EXPECT_FALSE(added[0] || added[1] || added[2]);

  CacheStats after;
  ASSERT_TRUE(cache->GetStats(&after).ok());
  EXPECT_EQ(after.puts_full, before.puts_full + 1) << "only the new row was refused";
  EXPECT_EQ(after.mem_rows, before.mem_rows);
  Row row;
  for (uint64_t i : {0, 1, 2}) {
    ASSERT_TRUE(cache->Get(i, &row).ok()) << i;
    EXPECT_TRUE(RowMatches(row, i, 0, kRowBytes)) << "row " << i << " was replaced";
  }
}

}  // namespace
}  // namespace shmcache::test
