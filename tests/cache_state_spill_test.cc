// A cache's spilling (cache_state_spill.cc): a cache that stops spilling
// fills like any other, and the rows it had on disk become misses.
#include "daemon/cache_state.h"

#include <memory>
#include <set>

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

// A spilling cache whose memory the server's cap used up sends its rows to
// disk; once the cap frees up it takes rows in memory again
// (ResumeIfCapAllows clears kStateMemFull with the cap's mark). Its rows on
// disk were then never dropped where they can no longer be read (a server
// restarted on another spill dir, or none: CacheSpiller::Reconcile), as
// DropSpilledRows looked only where kStateMemFull was set: their slots kept
// pointing at rows that are not there, a miss on every read that no put
// could fill (a slot holds the id: the first writer won), and the stats
// counted them on disk.
TEST_F(CacheStateTest, RowsSpilledWhileTheCapWasUsedUpAreDroppedOnceMemoryIsBack) {
  Create(64 * kMB, 1, /*spill_requested=*/true);
  account_.cap = account_.used + 6 * kMB;  // room for about one segment
  ASSERT_TRUE(LeaseUntilRefused(kMB / 2).IsFull());
  ASSERT_TRUE(cache_->Stats().spills_now);
  for (uint64_t id = 0; id < 10; ++id) {
    bool inserted = false;
    ASSERT_TRUE(cache_->PublishSpilled(id, 100, &account_, &inserted).ok());
    ASSERT_TRUE(inserted);
  }
  account_.cap = 256 * kMB;  // as when another session's memory is released
  ASSERT_TRUE(cache_->ResumeIfCapAllows(account_));
  ASSERT_FALSE(cache_->Stats().spills_now) << "rows go to memory again";
  EXPECT_EQ(cache_->DropSpilledRows(), 10u);
  EXPECT_EQ(cache_->Stats().disk_rows, 0u);
  bool inserted = false;
  ASSERT_TRUE(cache_->PublishSpilled(3, 100, &account_, &inserted).ok());
  EXPECT_TRUE(inserted) << "a dropped id is cached again when put";
}

// A spilling cache whose memory is used up and whose spilling then stopped
// (a disk error: StopSpilling) is full. Its warning names the fix: open it
// with a larger size_mb. That open raised the budget and left the cache
// full for good (TakeRowsAgain kept any cache with kStateMemFull full), so
// the rows it could now hold in memory were all read from the source.
TEST_F(CacheStateTest, ACacheThatStoppedSpillingTakesRowsAgainWhenItsBudgetIsRaised) {
  Create(8 * kMB, 1, /*spill_requested=*/true);
  ASSERT_TRUE(LeaseUntilRefused(kMB / 4).IsFull());
  ASSERT_TRUE(cache_->Stats().spills_now);
  bool inserted = false;
  ASSERT_TRUE(cache_->PublishSpilled(7, 100, &account_, &inserted).ok());
  cache_->StopSpilling("spill disk full");
  ASSERT_TRUE(cache_->Stats().full);
  EXPECT_FALSE(cache_->RequestSpilling()) << "not again in this server's life";
  ASSERT_TRUE(cache_->RaiseBudget(32 * kMB));
  EXPECT_FALSE(cache_->Stats().full);
  ChunkLease l;
  EXPECT_TRUE(Lease(1, 0, kMB / 4, &l).ok()) << "rows go to memory again";
  EXPECT_FALSE(cache_->Stats().spills_now);
  // Its row on disk is still found where it has to be dropped.
  EXPECT_EQ(cache_->DropSpilledRows(), 1u);
}

// The same cache adopted by the next server (its spilling stopped in the
// earlier one's life), opened again with spilling=True, the other fix its
// warning names: spilling was turned on and the cache stayed full, so that
// not one row went to disk.
TEST_F(CacheStateTest, ACacheThatStoppedSpillingSpillsAgainWhenTheNextServerIsAsked) {
  Create(8 * kMB, 1, /*spill_requested=*/true);
  ASSERT_TRUE(LeaseUntilRefused(kMB / 4).IsFull());
  cache_->StopSpilling("spill disk full");
  ASSERT_TRUE(cache_->Stats().full);
  std::set<uint32_t> segments;
  for (uint32_t i = 0; i < SegmentFiles(); ++i) segments.insert(i);
  MemoryAccount fresh;
  fresh.cap = 256 * kMB;
  std::unique_ptr<CacheState> adopted;
  ASSERT_TRUE(
      CacheState::Adopt(paths_, kCacheId, segments, 1, &fresh, nullptr, &adopted).ok());
  ASSERT_TRUE(adopted->Stats().full);
  ASSERT_TRUE(adopted->RequestSpilling());
  EXPECT_FALSE(adopted->Stats().full);
  EXPECT_TRUE(adopted->spilling_on());
  ChunkLease l;
  EXPECT_TRUE(adopted->Lease(1, 0, kMB / 4, &fresh, &l).IsFull()) << "memory is used up";
  EXPECT_TRUE(adopted->Stats().spills_now) << "rows past memory go to disk";
  adopted.reset();
  fresh.Release(fresh.used);
}

}  // namespace
}  // namespace shmcache
