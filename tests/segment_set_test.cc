// SegmentSet: a client's mapping of a cache's data segments and the one
// checked reading of a row at an index location, over a real cache the
// daemon's CacheState made (no daemon process): a row written into a
// leased chunk as a client writes it is read back; every location that
// does not hold that row is told apart.
#include "lib/segment_set.h"

#include <cstring>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "format/row_codec.h"
#include "tests/support/cache_state_fixture.h"

namespace shmcache {
namespace {

class SegmentSetTest : public CacheStateTest {
 protected:
  void SetUp() override {
    CacheStateTest::SetUp();
    Create(64 * kMB);
    segments_ = std::make_unique<SegmentSet>(kCacheId, [this] { return paths_; });
    ASSERT_TRUE(Lease(/*conn=*/1, /*node=*/0, 4096, &lease_).ok());
  }
  void TearDown() override {
    segments_.reset();
    CacheStateTest::TearDown();
  }
  // Writes row `id` at the end of the leased chunk, as a client does, and
  // returns its location.
  uint64_t WriteRow(uint64_t id) {
    static const int64_t shape[1] = {4};
    const char data[4] = {'r', 'o', 'w', static_cast<char>(id)};
    const ColumnRef col{"c", DType::kUInt8, shape, data, sizeof data};
    size_t size = 0;
    EXPECT_TRUE(RowCodec::EncodedSize(std::span(&col, 1), &size).ok());
    layout::ChunkHeader* chunk = Chunk(lease_);
    const uint64_t off = chunk->used.load();
    chunk->used.store(off + size);
    RowCodec::Encode(id, std::span(&col, 1), reinterpret_cast<std::byte*>(chunk) + off,
                     size);
    return layout::MakeLocation(lease_.seg_no, lease_.offset + off);
  }

  std::unique_ptr<SegmentSet> segments_;
  ChunkLease lease_;
};

TEST_F(SegmentSetTest, ARowIsReadOnceItsSegmentIsMapped) {
  const uint64_t loc = WriteRow(9);
  RowView view;
  int node = -1;
  EXPECT_EQ(segments_->ReadRow(9, loc, &view, &node), SegmentSet::RowCheck::kNotMapped);
  EXPECT_EQ(segments_->Find(lease_.seg_no), nullptr);
  ASSERT_TRUE(segments_->Resolve(9, loc, &view, &node).ok()) << "maps the segment";
  EXPECT_EQ(node, 0);
  EXPECT_TRUE(view.in_shared_memory());
  ASSERT_EQ(view.num_columns(), 1u);
  EXPECT_EQ(std::memcmp(view.column(0).data, "row\x09", 4), 0);
  ASSERT_NE(segments_->Find(lease_.seg_no), nullptr);
  RowView again;
  EXPECT_EQ(segments_->ReadRow(9, loc, &again, &node), SegmentSet::RowCheck::kOk);
  EXPECT_EQ(again.encoded().data(), view.encoded().data()) << "one mapping per segment";
  segments_->Prefetch(loc);
}

TEST_F(SegmentSetTest, EveryLocationThatIsNotTheRowIsToldApart) {
  const uint64_t loc = WriteRow(9);
  RowView view;
  int node = 0;
  ASSERT_TRUE(segments_->Resolve(9, loc, &view, &node).ok());

  // Another id's row at that place.
  EXPECT_EQ(segments_->ReadRow(10, loc, &view, &node), SegmentSet::RowCheck::kMismatch);
  Status s = segments_->Resolve(10, loc, &view, &node);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.ToString().find("does not match"), std::string::npos) << s.ToString();

  // Inside the segment header, misaligned, and past the segment's end.
  const size_t seg_size = SegmentSize(lease_.seg_no);
  for (uint64_t bad : {layout::MakeLocation(lease_.seg_no, 64), loc + 4,
                       layout::MakeLocation(lease_.seg_no, seg_size)}) {
    EXPECT_EQ(segments_->ReadRow(9, bad, &view, &node), SegmentSet::RowCheck::kOutside)
        << bad;
    s = segments_->Resolve(9, bad, &view, &node);
    EXPECT_TRUE(s.IsCorruption()) << bad;
    EXPECT_NE(s.ToString().find("outside its segment"), std::string::npos);
  }
  // Zeroed memory past the rows written: no row there.
  const uint64_t past = loc + 64;
  EXPECT_EQ(segments_->ReadRow(9, past, &view, &node), SegmentSet::RowCheck::kMismatch);
}

TEST_F(SegmentSetTest, ASegmentThatIsNotThereOrNotThisCachesIsRefused) {
  const MappedSegment* seg = nullptr;
  Status s = segments_->Map(lease_.seg_no + 1, &seg);
  EXPECT_FALSE(s.ok()) << "no such file";
  RowView view;
  int node = 0;
  EXPECT_FALSE(
      segments_->Resolve(1, layout::MakeLocation(lease_.seg_no + 1, 4096), &view, &node)
          .ok());
  // A copy of the segment under another cache's name.
  SegmentSet other(kCacheId + 1, [this] { return paths_; });
  const std::string theirs = paths_.SegmentFile(kCacheId + 1, lease_.seg_no);
  std::filesystem::copy_file(paths_.SegmentFile(kCacheId, lease_.seg_no), theirs);
  s = other.Map(lease_.seg_no, &seg);
  std::filesystem::remove(theirs);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

}  // namespace
}  // namespace shmcache
