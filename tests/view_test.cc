// Cache::View (row.h): a view points into shared memory, stays valid and
// in place while the cache grows, outlives Close() and its session, and is
// read-only. A real daemon per test (integration_fixture.h).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/child_process.h"
#include "tests/support/integration_fixture.h"
#include "tests/support/row_pattern.h"

namespace shmcache::test {
namespace {

// row.h's statement of a view's lifetime: a view of shared memory stays
// valid until its Cache is destroyed; Close() and the destruction of its
// session do not end it.
TEST_F(IntegrationTest, ViewOfSharedMemoryOutlivesCloseAndTheSession) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 0, 0, kRowBytes).ok());
  RowView view;
  ASSERT_TRUE(cache->View(0, &view).ok());
  ASSERT_TRUE(view.in_shared_memory());
  cache->Close();
  ASSERT_TRUE(client->DestroySession(session_).ok());
  ASSERT_EQ(view.column(0).nbytes, kRowBytes);
  EXPECT_EQ(std::memcmp(view.column(0).data, Pattern(0, 0, kRowBytes).data(), kRowBytes),
            0);
}

// A view points into shared memory and stays valid while the cache is open,
// whatever else is written (new chunks, new segments, a grown index).
TEST_F(IntegrationTest, ViewStaysValid) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache, "train", /*size_mb=*/64);
  ASSERT_TRUE(PutPattern(*cache, 0, 0, kRowBytes).ok());
  RowView view;
  ASSERT_TRUE(cache->View(0, &view).ok());
  const std::byte* where = view.column(0).data;
  // 64 MB budget: the first index table has 2^16 slots, so 60000 small rows
  // grow it, and the rows need several segments.
  CacheStats st0;
  ASSERT_TRUE(cache->GetStats(&st0).ok());
  std::vector<uint8_t> small(200);
  for (uint64_t id = 1; id < 60000; ++id) {
    FillPattern(id, 0, small.data(), small.size());
    ASSERT_TRUE(cache->Put(id, small.data(), small.size()).ok()) << id;
  }
  CacheStats st1;
  ASSERT_TRUE(cache->GetStats(&st1).ok());
  EXPECT_GT(st1.reserved_bytes, st0.reserved_bytes + (8 << 20));
  ASSERT_EQ(view.column(0).data, where);
  EXPECT_EQ(std::memcmp(view.column(0).data, Pattern(0, 0, kRowBytes).data(), kRowBytes),
            0);
  RowView again;
  ASSERT_TRUE(cache->View(0, &again).ok());
  EXPECT_EQ(again.column(0).data, where) << "zero-copy: the same bytes";
  Row row;
  for (uint64_t id = 1; id < 60000; id += 997) {
    ASSERT_TRUE(cache->Get(id, &row).ok());
    ASSERT_TRUE(RowMatches(row, id, 0, small.size()));
  }
}

// Views point into memory this process maps read-only: a write through
// one faults in the writer (even the process that put the row) and never
// reaches what others read.
TEST_F(IntegrationTest, AWriteThroughAViewFaultsAndChangesNothing) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 5, 0, kRowBytes).ok());
  RowView view;
  ASSERT_TRUE(cache->View(5, &view).ok());
  EXPECT_TRUE(view.in_shared_memory());
  Row row;
  ASSERT_TRUE(cache->Get(5, &row).ok());
  EXPECT_FALSE(row.view().in_shared_memory());
  pid_t pid = ForkChild([&] {
    // The fault kills the child as the kernel does: a sanitizer's handler
    // (scripts/test.sh runs this suite under TSan and ASan) would report it
    // as a crash of its own and exit instead.
    std::signal(SIGSEGV, SIG_DFL);
    auto* p = const_cast<std::byte*>(view.column(0).data);
    *reinterpret_cast<volatile std::byte*>(p) = std::byte{0x5a};
    return 0;  // not reached: the store faults
  });
  EXPECT_EQ(WaitChild(pid), -SIGSEGV);
  ASSERT_TRUE(cache->Get(5, &row).ok());
  EXPECT_TRUE(RowMatches(row, 5, 0, kRowBytes));
}

// ViewBatch and GetBatch read a long batch through a pipeline
// (cache_read.cc: slots and row headers prefetched ahead of the row being
// read): every view and copy is its own id's row, every absent id a
// NotFound with an empty view, and hits and misses are counted exactly,
// with one index table and with several, and in a process that maps the
// segments as it meets them.
TEST_F(IntegrationTest, BatchedReadsOfALongMixedBatch) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  // 64 MB budget: the first index table has 2^16 slots; 60000 rows grow it.
  Attach(&client, &cache, "train", /*size_mb=*/64);
  constexpr size_t kBytes = 200;
  std::vector<uint8_t> v(kBytes);
  auto put = [&](uint64_t from, uint64_t to) {
    for (uint64_t id = from; id < to; ++id) {
      FillPattern(id, 0, v.data(), v.size());
      ASSERT_TRUE(cache->Put(id, v.data(), v.size()).ok()) << id;
    }
  };
  // 300 ids, every third absent; the others spread over rows [0, n).
  auto batch = [](uint64_t n) {
    std::vector<uint64_t> ids(300);
    for (size_t k = 0; k < ids.size(); ++k) {
      ids[k] = k % 3 == 2 ? 1000000 + k : (k * 7919) % n;
    }
    return ids;
  };
  // "" when every view and status is right, else the first wrong one.
  auto check = [&](Cache& c, const std::vector<uint64_t>& ids) -> std::string {
    std::vector<RowView> views(ids.size());
    std::vector<Row> rows(ids.size());
    std::vector<Status> statuses(ids.size());
    std::vector<Status> copied(ids.size());
    Status s = c.ViewBatch(ids, views, statuses);
    if (!s.ok()) return "ViewBatch: " + s.ToString();
    s = c.GetBatch(ids, rows, copied);
    if (!s.ok()) return "GetBatch: " + s.ToString();
    for (size_t k = 0; k < ids.size(); ++k) {
      const std::string at = "id " + std::to_string(ids[k]) + ": ";
      if (k % 3 == 2 ? !copied[k].IsNotFound() || !rows[k].view().encoded().empty()
                     : !copied[k].ok() || !RowMatches(rows[k], ids[k], 0, kBytes)) {
        return at + "GetBatch: " + copied[k].ToString();
      }
      if (k % 3 == 2) {
        if (!statuses[k].IsNotFound())
          return at + "not a miss: " + statuses[k].ToString();
        if (!views[k].encoded().empty()) return at + "a miss with a view";
      } else if (!statuses[k].ok()) {
        return at + statuses[k].ToString();
      } else if (!views[k].in_shared_memory() || views[k].column(0).nbytes != kBytes ||
                 std::memcmp(views[k].column(0).data, Pattern(ids[k], 0, kBytes).data(),
                             kBytes) != 0) {
        return at + "another row's bytes";
      }
    }
    return "";
  };
  auto counts = [&](CacheStats* st) { ASSERT_TRUE(cache->GetStats(st).ok()); };

  put(0, 1000);  // one index table
  CacheStats st0, st1;
  counts(&st0);
  EXPECT_EQ(check(*cache, batch(1000)), "");
  counts(&st1);
  EXPECT_EQ(st1.hits - st0.hits, 400u);
  EXPECT_EQ(st1.misses - st0.misses, 200u);

  put(1000, 60000);  // several tables, several segments
  EXPECT_EQ(check(*cache, batch(60000)), "");
  CacheStats st2;
  counts(&st2);
  EXPECT_EQ(st2.hits - st1.hits, 400u);
  EXPECT_EQ(st2.misses - st1.misses, 200u);

  // A process that opens the cache afresh has mapped no segment yet.
  pid_t pid = ForkChild([&] {
    std::unique_ptr<Client> c2;
    if (!server_->Connect(&c2).ok()) return 2;
    std::unique_ptr<Cache> k2 = Open(*c2, Options(session_, "train", 64));
    if (k2 == nullptr) return 3;
    const std::string why = check(*k2, batch(60000));
    if (!why.empty()) std::fprintf(stderr, "child: %s\n", why.c_str());
    return why.empty() ? 0 : 4;
  });
  EXPECT_EQ(WaitChild(pid), 0);
}

}  // namespace
}  // namespace shmcache::test
