// The spill side (cache_spiller.cc): rows put to the spill store are
// published in the cache and read back; without a store nothing spills;
// at start, adopted spilled rows this server cannot read are dropped.
// (The daemon end to end: spill_test.cc, spill_read_test.cc.)
#include "daemon/cache_spiller.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/cache_state.h"
#include "daemon/logger.h"
#include "format/row_codec.h"
#include "tests/support/cache_state_fixture.h"

namespace shmcache {
namespace {

class CacheSpillerTest : public CacheStateTest {
 protected:
  void SetUp() override {
    CacheStateTest::SetUp();
    spill_dir_ = test::MakeTempDir(test::TestTmpRoot(), "spiller");
  }
  void TearDown() override {
    spiller_.Shutdown();
    test::RemoveTree(spill_dir_);
    CacheStateTest::TearDown();
  }
  CacheSpiller::NoteFn Note() {
    return [this](const std::string& text) { notes_.push_back(text); };
  }
  static std::span<const std::byte> Bytes(const std::string& s) {
    return std::as_bytes(std::span<const char>(s.data(), s.size()));
  }
  // Row `key` encoded whole, with one uint8 column holding `text`: the
  // daemon serves a spilled row only if it is a whole row of its id.
  static std::string RowOf(uint64_t key, const std::string& text) {
    const int64_t shape[1] = {static_cast<int64_t>(text.size())};
    const ColumnRef col{"data", DType::kUInt8, shape, text.data(), text.size()};
    size_t size = 0;
    EXPECT_TRUE(RowCodec::EncodedSize(std::span(&col, 1), &size).ok());
    std::vector<uint64_t> aligned((size + 7) / 8);
    RowCodec::Encode(key, std::span(&col, 1),
                     reinterpret_cast<std::byte*>(aligned.data()), size);
    return std::string(reinterpret_cast<const char*>(aligned.data()), size);
  }
  // Leases 256 KB chunks until the cache's memory is used up.
  void UseUpMemory() {
    Status s;
    for (int n = 0; n < 1000 && s.ok(); ++n) {
      ChunkLease l;
      s = Lease(1, 0, uint64_t{256} << 10, &l);
    }
    ASSERT_TRUE(s.IsFull()) << s.ToString();
  }

  Logger log_;  // not opened: lines go nowhere
  CacheSpiller spiller_{paths_, &log_};
  std::string spill_dir_;
  std::vector<std::string> notes_;
};

TEST_F(CacheSpillerTest, WithoutAStoreNothingSpills) {
  ASSERT_TRUE(spiller_.Open("", Note()).ok());
  EXPECT_FALSE(spiller_.enabled());
  Create(8 * kMB, 1, /*spill_requested=*/true);
  bool inserted = true;
  Status s = spiller_.Put(kCacheId, cache_.get(), 1, Bytes("row"), &account_, &inserted);
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_FALSE(inserted);
  std::vector<std::string> rows;
  std::vector<Status> found;
  const uint64_t ids[] = {1};
  EXPECT_TRUE(spiller_.Get(kCacheId, ids, &rows, &found).IsNotFound());
  EXPECT_TRUE(spiller_.DropCache(kCacheId).ok());
  EXPECT_TRUE(spiller_.CacheIds().empty());
}

TEST_F(CacheSpillerTest, PutRowsArePublishedAndReadBack) {
  ASSERT_TRUE(spiller_.Open(spill_dir_, Note()).ok());
  ASSERT_TRUE(spiller_.enabled());
  Create(8 * kMB, 1, /*spill_requested=*/true);
  bool inserted = false;
  const std::string row = RowOf(42, "forty-two");
  ASSERT_TRUE(
      spiller_.Put(kCacheId, cache_.get(), 42, Bytes(row), &account_, &inserted).ok());
  EXPECT_TRUE(inserted);
  EXPECT_EQ(cache_->Stats().disk_rows, 1u);
  EXPECT_EQ(cache_->Stats().disk_bytes, row.size());
  std::vector<std::string> rows;
  std::vector<Status> found;
  const uint64_t ids[] = {42, 43};
  ASSERT_TRUE(spiller_.Get(kCacheId, ids, &rows, &found).ok());
  ASSERT_EQ(found.size(), 2u);
  EXPECT_TRUE(found[0].ok()) << found[0].ToString();
  EXPECT_TRUE(found[1].IsNotFound()) << found[1].ToString();
  EXPECT_EQ(rows[0], row);
  EXPECT_EQ(spiller_.CacheIds(), std::vector<uint32_t>{kCacheId});
  ASSERT_TRUE(spiller_.DropCache(kCacheId).ok());
  ASSERT_TRUE(spiller_.Get(kCacheId, ids, &rows, &found).ok());
  ASSERT_EQ(found.size(), 2u);
  EXPECT_TRUE(found[0].IsNotFound() && found[1].IsNotFound());
  EXPECT_TRUE(notes_.empty()) << testing::PrintToString(notes_);
}

TEST_F(CacheSpillerTest, ACacheThatDoesNotSpillIsFull) {
  ASSERT_TRUE(spiller_.Open(spill_dir_, Note()).ok());
  Create(8 * kMB);
  bool inserted = true;
  Status s = spiller_.Put(kCacheId, cache_.get(), 1, Bytes("row"), &account_, &inserted);
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_FALSE(inserted);
  EXPECT_TRUE(spiller_.CacheIds().empty());
}

TEST_F(CacheSpillerTest, ReconcileWithoutAStoreDropsSpilledRowsAndStopsSpilling) {
  ASSERT_TRUE(spiller_.Open("", Note()).ok());
  Create(8 * kMB, 1, /*spill_requested=*/true);
  UseUpMemory();
  for (uint64_t id = 0; id < 3; ++id) {
    bool inserted = false;
    ASSERT_TRUE(cache_->PublishSpilled(id, 100, &account_, &inserted).ok());
  }
  std::map<uint32_t, std::unique_ptr<CacheState>> caches;
  caches[kCacheId] = std::move(cache_);
  spiller_.Reconcile(caches, Note());
  cache_ = std::move(caches[kCacheId]);
  EXPECT_EQ(cache_->Stats().disk_rows, 0u);
  EXPECT_FALSE(cache_->spill_enabled());
  EXPECT_TRUE(cache_->Stats().full) << "memory was used up and nothing spills";
  ASSERT_EQ(notes_.size(), 1u);
  EXPECT_NE(notes_[0].find("3 spilled rows were dropped (this server has no spill "
                           "directory)"),
            std::string::npos)
      << notes_[0];
  EXPECT_NE(notes_[0].find("it no longer spills and is full"), std::string::npos)
      << notes_[0];
}

}  // namespace
}  // namespace shmcache
