// CacheState (cache_state.cc): a cache's header and first table made at
// create, refused cleanly without room, and every file and byte given back
// at destroy (or kept reserved while readers still map them).
#include "daemon/cache_state.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cache_state_fixture.h"

namespace shmcache {
namespace {

TEST_F(CacheStateTest, CreateMakesHeaderAndFirstTable) {
  Create(64 * kMB);
  ShmFile header;
  ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header).ok());
  EXPECT_EQ(layout::CheckFileHeader(header.data(), header.size(), layout::kCacheMagic,
                                    sizeof(layout::CacheHeader)),
            nullptr);
  auto* h = reinterpret_cast<layout::CacheHeader*>(header.data());
  EXPECT_EQ(h->cache_id, kCacheId);
  EXPECT_EQ(h->session_id, 77u);
  EXPECT_EQ(std::string(h->name, h->name_len), "train");
  EXPECT_EQ(std::string(h->fingerprint, h->fingerprint_len), "fp-1");
  EXPECT_EQ(h->budget_bytes, 64 * kMB);
  EXPECT_EQ(h->num_tables.load(), 1u);
  ShmFile table;
  ASSERT_TRUE(
      ShmFile::Open(paths_.TableFile(kCacheId, 0, h->tables[0].tag), &table).ok());
  EXPECT_EQ(layout::CheckFileHeader(table.data(), table.size(), layout::kTableMagic,
                                    sizeof(layout::TableHeader)),
            nullptr);
  EXPECT_EQ(reinterpret_cast<layout::TableHeader*>(table.data())->capacity,
            h->tables[0].capacity.load());
  EXPECT_EQ(account_.used, cache_->reserved_bytes());
  EXPECT_EQ(h->reserved_bytes.load(), cache_->reserved_bytes());
  EXPECT_EQ(SegmentFiles(), 0u) << "no data segment before the first lease";
}

TEST_F(CacheStateTest, DestroyUnlinksEveryFileAndReleasesMemory) {
  Create(64 * kMB, 2);
  for (int i = 0; i < 4; ++i) {
    ChunkLease l;
    ASSERT_TRUE(Lease(1, i % 2, 3 * kMB, &l).ok());
  }
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  EXPECT_GE(SegmentFiles(), 2u);
  EXPECT_GT(account_.used, 8 * kMB);
  // A reader that still maps a segment keeps its bytes (and its view).
  layout::SegmentHeader* seg0 = Segment(0);
  cache_->Destroy(&account_);
  EXPECT_TRUE(ListDir(shm_dir_).empty()) << testing::PrintToString(ListDir(shm_dir_));
  EXPECT_EQ(account_.used, 0u);
  EXPECT_EQ(cache_->reserved_bytes(), 0u);
  EXPECT_EQ(seg0->file.magic, layout::kSegmentMagic);
  ChunkLease l;
  EXPECT_TRUE(Lease(1, 0, 100, &l).IsNotFound());
  EXPECT_TRUE(cache_->GrowIndex(2, &account_).IsNotFound());
  cache_->Return(1, 0, layout::kSegmentHeaderSize);  // harmless
  cache_->ReleaseConnection(1);
  cache_->Destroy(&account_);  // twice is harmless
  cache_.reset();
}

TEST_F(CacheStateTest, DestroyWithHeldKeepsEveryFileReservedAndNamesIt) {
  Create(64 * kMB);
  for (int i = 0; i < 3; ++i) {
    ChunkLease l;
    ASSERT_TRUE(Lease(1, 0, 3 * kMB, &l).ok());
  }
  const uint64_t reserved = cache_->reserved_bytes();
  const size_t files = ListDir(shm_dir_).size();
  std::vector<HeldFile> held;
  cache_->Destroy(&account_, &held);
  EXPECT_TRUE(ListDir(shm_dir_).empty());
  ASSERT_EQ(held.size(), files);
  uint64_t sum = 0;
  std::set<FileId> ids;
  for (const HeldFile& f : held) {
    sum += f.bytes;
    ids.insert(f.id);
  }
  EXPECT_EQ(ids.size(), files) << "each file has its own identity";
  EXPECT_EQ(sum, reserved);
  EXPECT_EQ(account_.used, reserved) << "held until the caller releases it";
  account_.Release(sum);
  cache_.reset();
}

TEST_F(CacheStateTest, CreateFailsCleanlyWithoutRoomUnderTheCap) {
  account_.cap = 4096;  // not even the header fits
  std::unique_ptr<CacheState> c;
  Status s = CacheState::Create(paths_, kCacheId, 77, "x", "x", kMB, false, 1, &account_,
                                nullptr, &c);
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_EQ(account_.used, 0u);
  account_.cap = 256 * kMB;
}

}  // namespace
}  // namespace shmcache
