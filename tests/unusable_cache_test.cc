// Every call of a Cache that cannot be used (cache.h: "Errors common to
// every call"): InvalidArgument once Close()d, NotFound once its session
// was destroyed, with each call's outputs as its comment states (status.h,
// row.h). A real daemon per test (integration_fixture.h).
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/integration_fixture.h"

namespace shmcache::test {
namespace {

enum class Why { kClosed, kSessionDestroyed };

class UnusableCacheTest : public IntegrationTest,
                          public ::testing::WithParamInterface<Why> {
 protected:
  // A cache with row 0 stored, then made unusable as the parameter says.
  void SetUp() override {
    IntegrationTest::SetUp();
    if (HasFatalFailure()) return;
    Attach(&client_, &cache_);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(PutPattern(*cache_, 0, 0, kRowBytes).ok());
    if (GetParam() == Why::kClosed) {
      cache_->Close();
    } else {
      ASSERT_TRUE(client_->DestroySession(session_).ok());
    }
  }
  // The error every call returns: its code, and a message saying why.
  void ExpectWhy(const Status& s, const char* call) const {
    if (GetParam() == Why::kClosed) {
      EXPECT_TRUE(s.IsInvalidArgument()) << call << ": " << s.ToString();
      EXPECT_NE(s.message().find("closed"), std::string::npos)
          << call << ": " << s.message();
    } else {
      EXPECT_TRUE(s.IsNotFound()) << call << ": " << s.ToString();
      EXPECT_NE(s.message().find("session " + std::to_string(session_)),
                std::string::npos)
          << call << ": " << s.message();
    }
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<Cache> cache_;
};

TEST_P(UnusableCacheTest, PutsStoreNothingAndSayWhy) {
  bool inserted = true;
  std::vector<uint8_t> data(100, 1);
  ExpectWhy(cache_->Put(1, data.data(), data.size(), &inserted), "Put");
  EXPECT_FALSE(inserted) << "Put sets *inserted on every return";
  int64_t shape[] = {4};
  int32_t values[] = {1, 2, 3, 4};
  ColumnRef col{"v", DType::kInt32, shape, values, sizeof values};
  inserted = true;
  ExpectWhy(cache_->Put(2, std::span(&col, 1), &inserted), "Put(columns)");
  EXPECT_FALSE(inserted);
  const uint64_t ids[] = {3, 4};
  const std::span<const ColumnRef> rows[] = {std::span(&col, 1), std::span(&col, 1)};
  Status statuses[2];
  bool flags[2] = {true, true};
  ExpectWhy(cache_->PutBatch(ids, rows, statuses, flags), "PutBatch");
  for (size_t i = 0; i < 2; ++i) {
    ExpectWhy(statuses[i], "PutBatch's statuses");
    EXPECT_FALSE(flags[i]) << i;
  }
  EXPECT_FALSE(cache_->Contains(1));
  EXPECT_FALSE(cache_->Contains(3));
}

TEST_P(UnusableCacheTest, ReadsOfAStoredRowSayWhyAndLeaveTheirOutputsEmpty) {
  Row row;
  ExpectWhy(cache_->Get(0, &row), "Get");
  EXPECT_EQ(row.num_columns(), 0u);
  const std::string_view only[] = {"data"};
  ExpectWhy(cache_->Get(0, only, &row), "Get(columns)");
  EXPECT_EQ(row.num_columns(), 0u);
  RowView view;
  ExpectWhy(cache_->View(0, &view), "View");
  EXPECT_TRUE(view.empty());
  const uint64_t ids[] = {0, 1};
  Row rows[2];
  Status statuses[2];
  ExpectWhy(cache_->GetBatchUncounted(ids, rows, statuses), "GetBatchUncounted");
  for (size_t i = 0; i < 2; ++i) {
    ExpectWhy(statuses[i], "GetBatchUncounted's statuses");
    EXPECT_EQ(rows[i].num_columns(), 0u) << i;
  }
  RowView views[2];
  Status view_statuses[2];
  ExpectWhy(cache_->ViewBatchUncounted(ids, views, view_statuses), "ViewBatchUncounted");
  for (size_t i = 0; i < 2; ++i) {
    ExpectWhy(view_statuses[i], "ViewBatchUncounted's statuses");
    EXPECT_TRUE(views[i].empty()) << i;
  }
  EXPECT_FALSE(cache_->Contains(0)) << "Contains is false when the cache is unusable";
}

TEST_P(UnusableCacheTest, StatsAndTheStreamingCallsSayWhyAndLeaveTheirOutputs) {
  CacheStats st;
  st.hits = 777;
  ExpectWhy(cache_->GetStats(&st), "GetStats");
  EXPECT_EQ(st.hits, 777u) << "*out unchanged";
  bool claimed = true;
  ExpectWhy(cache_->ClaimBuild(&claimed), "ClaimBuild");
  EXPECT_FALSE(claimed) << "*claimed is false after an error";
  ExpectWhy(cache_->Seal(5), "Seal");
  uint64_t n = 12345;
  ExpectWhy(cache_->GetSealedRows(&n), "GetSealedRows");
  EXPECT_EQ(n, 12345u) << "*num_rows is set only on OK";
}

// Close() again, and the destructor after it, do nothing more; the ids
// stay what they were.
TEST_P(UnusableCacheTest, CloseAgainIsHarmlessAndTheIdsStay) {
  const uint32_t cache_id = cache_->cache_id();
  cache_->Close();
  cache_->Close();
  EXPECT_EQ(cache_->cache_id(), cache_id);
  EXPECT_EQ(cache_->session_id(), session_);
  Row row;
  Status s = cache_->Get(0, &row);
  if (GetParam() == Why::kClosed) {
    ExpectWhy(s, "Get after a second Close");
  } else {
    EXPECT_FALSE(s.ok()) << s.ToString();
  }
  cache_.reset();
}

INSTANTIATE_TEST_SUITE_P(Unusable, UnusableCacheTest,
                         ::testing::Values(Why::kClosed, Why::kSessionDestroyed),
                         [](const ::testing::TestParamInfo<Why>& info) {
                           return info.param == Why::kClosed ? "Closed"
                                                             : "SessionDestroyed";
                         });

}  // namespace
}  // namespace shmcache::test
