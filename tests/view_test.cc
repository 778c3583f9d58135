// Cache::View (row.h): a view points into shared memory, stays valid and
// in place while the cache grows, outlives Close() and its session, and is
// read-only. A real daemon per test (integration_fixture.h).
#include <csignal>
#include <cstring>
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

}  // namespace
}  // namespace shmcache::test
