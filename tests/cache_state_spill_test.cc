// A cache's spilling (cache_state_spill.cc): a cache that stops spilling
// fills like any other, and the rows it had on disk become misses.
#include "daemon/cache_state.h"

#include <gtest/gtest.h>

#include "tests/support/cache_state_fixture.h"

namespace shmcache {
namespace {

// Leases 256 KB chunks until the lease fails; returns that status.

TEST_F(CacheStateTest, SpillingStoppedBeforeMemoryIsUsedUpFillsLikeAnyCache) {
  Create(8 * kMB, 1, /*spill_requested=*/true);
  cache_->StopSpilling("no spill store");
  EXPECT_FALSE(cache_->spill_enabled());
  EXPECT_FALSE(cache_->Stats().full) << "memory is still free";
  EXPECT_TRUE(LeaseUntilRefused(kMB / 4).IsFull());
  EXPECT_TRUE(cache_->Stats().full);
  EXPECT_FALSE(cache_->spilling_on());
}

TEST_F(CacheStateTest, DroppedSpilledRowsAreMissesAndTheCacheIsFullWithoutSpilling) {
  Create(8 * kMB, 1, /*spill_requested=*/true);
  EXPECT_EQ(cache_->DropSpilledRows(), 0u) << "nothing spilled yet";
  EXPECT_TRUE(LeaseUntilRefused(kMB / 4).IsFull());
  ASSERT_TRUE(cache_->spilling_on());
  for (uint64_t id = 0; id < 10; ++id) {
    bool inserted = false;
    ASSERT_TRUE(cache_->PublishSpilled(id, 100, &account_, &inserted).ok());
    ASSERT_TRUE(inserted);
  }
  EXPECT_EQ(cache_->Stats().disk_rows, 10u);
  EXPECT_EQ(cache_->Stats().disk_bytes, 1000u);
  EXPECT_FALSE(cache_->Stats().full);
  EXPECT_EQ(cache_->DropSpilledRows(), 10u);
  EXPECT_EQ(cache_->Stats().disk_rows, 0u);
  EXPECT_EQ(cache_->Stats().disk_bytes, 0u);
  // Spilling on: a dropped id is published again.
  bool inserted = false;
  ASSERT_TRUE(cache_->PublishSpilled(3, 100, &account_, &inserted).ok());
  EXPECT_TRUE(inserted);
  // Spilling off with memory used up: full, as every put will find.
  cache_->StopSpilling("no spill store");
  EXPECT_TRUE(cache_->Stats().full);
  ShmFile header;
  ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header).ok());
  EXPECT_TRUE(reinterpret_cast<layout::CacheHeader*>(header.data())->state.load() &
              layout::kStateFull);
}

}  // namespace
}  // namespace shmcache
