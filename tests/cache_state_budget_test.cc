// A cache's memory (cache_state_budget.cc): what is left of its budget and
// of the server's cap, when it is full, and when it takes rows again.
#include "cache_state.h"

#include <string>

#include <gtest/gtest.h>

#include "cache_state_fixture.h"

namespace shmcache {
namespace {

TEST_F(CacheStateTest, BudgetUsedUpMeansFull) {
  Create(8 * kMB);
  uint64_t leased = 0;
  Status s;
  int n = 0;
  for (; n < 100; ++n) {
    ChunkLease l;
    s = Lease(1, 0, 256 * 1024, &l);
    if (!s.ok()) break;
    leased += l.size;
  }
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_NE(s.message().find("budget"), std::string::npos) << s.ToString();
  EXPECT_GT(n, 0);
  EXPECT_LE(leased, 8 * kMB);
  EXPECT_GT(leased, 6 * kMB) << "most of the budget was usable";
  CacheStats st = cache_->Stats();
  EXPECT_TRUE(st.full);
  EXPECT_EQ(st.budget_bytes, 8 * kMB);
  // Full stays full, for every connection.
  ChunkLease l;
  EXPECT_TRUE(Lease(2, 0, 64, &l).IsFull());
  ShmFile header;
  ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header).ok());
  EXPECT_TRUE(reinterpret_cast<layout::CacheHeader*>(header.data())->state.load() &
              layout::kStateFull);
}

TEST_F(CacheStateTest, ServerCapUsedUpMeansFull) {
  Create(64 * kMB);
  account_.cap = account_.used + 6 * kMB;  // room for about one segment
  Status s;
  for (int n = 0; n < 100 && s.ok(); ++n) {
    ChunkLease l;
    s = Lease(1, 0, 512 * 1024, &l);
  }
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_NE(s.message().find("cap"), std::string::npos) << s.ToString();
  EXPECT_LE(account_.used, account_.cap);
  account_.cap = 256 * kMB;  // for TearDown's accounting check
}

TEST_F(CacheStateTest, RowLargerThanWhatIsLeftIsTooLargeAndTheCacheStaysOpen) {
  Create(16 * kMB);
  ChunkLease l;
  ASSERT_TRUE(Lease(1, 0, 1000, &l).ok());
  Status s = Lease(1, 0, 13 * kMB, &l);
  ASSERT_TRUE(s.IsTooLarge()) << s.ToString();
  EXPECT_NE(s.message().find("13.0 MB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("16 MB"), std::string::npos) << s.message();
  EXPECT_FALSE(cache_->Stats().full);
  EXPECT_TRUE(Lease(2, 0, 1000, &l).ok()) << "other rows still fit";
  // Rows that use up the budget make it full, as ever.
  for (int n = 0; n < 100; ++n) {
    s = Lease(1, 0, 5 * kMB, &l);
    if (!s.ok()) break;
  }
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_TRUE(cache_->Stats().full);
  EXPECT_LE(account_.used, cache_->reserved_bytes());
}

TEST_F(CacheStateTest, CacheTheCapMadeFullTakesRowsAgainWhenTheCapFrees) {
  Create(64 * kMB);
  account_.cap = account_.used + 6 * kMB;
  Status s;
  ChunkLease l;
  for (int n = 0; n < 100 && s.ok(); ++n) s = Lease(1, 0, 512 * 1024, &l);
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_FALSE(cache_->ResumeIfCapAllows(account_)) << "nothing was freed";
  account_.cap += 8 * kMB;  // as when another session's memory is released
  EXPECT_TRUE(cache_->ResumeIfCapAllows(account_));
  EXPECT_FALSE(cache_->Stats().full);
  EXPECT_TRUE(Lease(1, 0, 512 * 1024, &l).ok());
  account_.cap = 256 * kMB;
}

TEST_F(CacheStateTest, CacheItsBudgetMadeFullStaysFull) {
  Create(4 * kMB);
  Status s;
  ChunkLease l;
  for (int n = 0; n < 100 && s.ok(); ++n) s = Lease(1, 0, 512 * 1024, &l);
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_FALSE(cache_->ResumeIfCapAllows(account_));
  EXPECT_TRUE(cache_->Stats().full);
}

}  // namespace
}  // namespace shmcache
