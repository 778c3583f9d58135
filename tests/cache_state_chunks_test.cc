// The daemon's allocator (cache_state_chunks.cc, cache_state_segments.cc):
// chunks leased from per-node segments, formatted and disjoint, given back,
// and the unused tails of chunks recycled.
#include "cache_state.h"

#include <vector>

#include <gtest/gtest.h>

#include "cache_state_fixture.h"

namespace shmcache {
namespace {

TEST_F(CacheStateTest, LeasedChunksAreFormattedAndDisjoint) {
  Create(64 * kMB);
  std::vector<ChunkLease> leases;
  for (int i = 0; i < 6; ++i) {
    ChunkLease l;
    ASSERT_TRUE(Lease(1, 0, 3000, &l).ok());
    leases.push_back(l);
  }
  for (const ChunkLease& l : leases) {
    SCOPED_TRACE(testing::Message() << "seg " << l.seg_no << " off " << l.offset);
    EXPECT_GE(l.offset, layout::kSegmentHeaderSize);
    EXPECT_EQ(l.offset % layout::kCacheLine, 0u);
    EXPECT_GE(l.size, sizeof(layout::ChunkHeader) + 3000);
    EXPECT_LE(l.offset + l.size, SegmentSize(l.seg_no));
    layout::ChunkHeader* c = Chunk(l);
    EXPECT_EQ(c->magic, layout::kChunkMagic);
    EXPECT_EQ(c->cache_id, kCacheId);
    EXPECT_EQ(c->size, l.size);
    EXPECT_EQ(c->used.load(), sizeof(layout::ChunkHeader));
    layout::SegmentHeader* seg = Segment(l.seg_no);
    EXPECT_EQ(seg->seg_id, l.seg_no);
    EXPECT_EQ(seg->cache_id, kCacheId);
    EXPECT_EQ(seg->node, 0u);
    EXPECT_GE(seg->carved.load(), l.offset + l.size);
  }
  for (size_t i = 0; i < leases.size(); ++i) {
    for (size_t j = i + 1; j < leases.size(); ++j) {
      const ChunkLease &a = leases[i], &b = leases[j];
      bool disjoint = a.seg_no != b.seg_no || a.offset + a.size <= b.offset ||
                      b.offset + b.size <= a.offset;
      EXPECT_TRUE(disjoint) << i << " overlaps " << j;
    }
  }
  EXPECT_EQ(account_.used, cache_->reserved_bytes());
}

TEST_F(CacheStateTest, BigRowGetsABigEnoughChunk) {
  Create(64 * kMB);
  ChunkLease l;
  ASSERT_TRUE(Lease(1, 0, 10 * kMB, &l).ok());
  EXPECT_GE(l.size, sizeof(layout::ChunkHeader) + 10 * kMB);
  EXPECT_LE(l.offset + l.size, SegmentSize(l.seg_no));
}

TEST_F(CacheStateTest, SegmentsBelongToTheRequestedNode) {
  Create(64 * kMB, /*nodes=*/2);
  ChunkLease n0, n1, n3;
  ASSERT_TRUE(Lease(1, 0, 1000, &n0).ok());
  ASSERT_TRUE(Lease(1, 1, 1000, &n1).ok());
  ASSERT_TRUE(Lease(1, 3, 1000, &n3).ok());  // wraps to node 1
  EXPECT_NE(n0.seg_no, n1.seg_no);
  EXPECT_EQ(Segment(n0.seg_no)->node, 0u);
  EXPECT_EQ(Segment(n1.seg_no)->node, 1u);
  EXPECT_EQ(Segment(n3.seg_no)->node, 1u);
}

TEST_F(CacheStateTest, ReturnedTailIsLeasedAgain) {
  Create(64 * kMB);
  ChunkLease a;
  ASSERT_TRUE(Lease(1, 0, 1000, &a).ok());
  // The client wrote 5000 bytes of rows.
  Chunk(a)->used.store(sizeof(layout::ChunkHeader) + 5000);
  cache_->Return(1, a.seg_no, a.offset);
  ChunkLease b;
  ASSERT_TRUE(Lease(2, 0, 1000, &b).ok());
  EXPECT_EQ(b.seg_no, a.seg_no);
  uint64_t tail = (a.offset + sizeof(layout::ChunkHeader) + 5000 + 63) / 64 * 64;
  EXPECT_EQ(b.offset, tail) << "the tail right after the rows";
  EXPECT_EQ(b.offset + b.size, a.offset + a.size);
  EXPECT_EQ(Chunk(b)->used.load(), sizeof(layout::ChunkHeader));
  EXPECT_EQ(Chunk(b)->size, b.size);
}

TEST_F(CacheStateTest, ReturnOfAnotherConnectionsChunkIsIgnored) {
  Create(64 * kMB);
  ChunkLease a;
  ASSERT_TRUE(Lease(1, 0, 1000, &a).ok());
  cache_->Return(2, a.seg_no, a.offset);       // not conn 2's
  cache_->Return(1, a.seg_no, a.offset + 64);  // no such chunk
  ChunkLease b;
  ASSERT_TRUE(Lease(3, 0, 1000, &b).ok());
  bool overlaps = b.seg_no == a.seg_no && b.offset < a.offset + a.size &&
                  a.offset < b.offset + b.size;
  EXPECT_FALSE(overlaps) << "a chunk still leased was handed out again";
}

TEST_F(CacheStateTest, UsedMarkBeyondTheChunkRecyclesNothing) {
  Create(64 * kMB);
  ChunkLease a;
  ASSERT_TRUE(Lease(1, 0, 1000, &a).ok());
  Chunk(a)->used.store(a.size + 4096);  // a hostile or broken client
  cache_->Return(1, a.seg_no, a.offset);
  ChunkLease b;
  ASSERT_TRUE(Lease(2, 0, 1000, &b).ok());
  bool overlaps = b.seg_no == a.seg_no && b.offset < a.offset + a.size &&
                  a.offset < b.offset + b.size;
  EXPECT_FALSE(overlaps);
}

TEST_F(CacheStateTest, FullChunkLeavesNoTail) {
  Create(64 * kMB);
  ChunkLease a;
  ASSERT_TRUE(Lease(1, 0, 1000, &a).ok());
  Chunk(a)->used.store(a.size - 1024);  // less than the recycling minimum left
  cache_->Return(1, a.seg_no, a.offset);
  ChunkLease b;
  ASSERT_TRUE(Lease(2, 0, 100, &b).ok());
  EXPECT_FALSE(b.seg_no == a.seg_no && b.offset >= a.offset &&
               b.offset < a.offset + a.size);
}

TEST_F(CacheStateTest, ReleaseConnectionRecyclesEveryChunkTail) {
  Create(64 * kMB, /*nodes=*/2);
  ChunkLease a0, a1;
  ASSERT_TRUE(Lease(1, 0, 1000, &a0).ok());
  ASSERT_TRUE(Lease(1, 1, 1000, &a1).ok());
  Chunk(a0)->used.store(sizeof(layout::ChunkHeader) + 128);
  Chunk(a1)->used.store(sizeof(layout::ChunkHeader) + 256);
  cache_->ReleaseConnection(1);  // the client went away (or died)
  ChunkLease b0, b1;
  ASSERT_TRUE(Lease(2, 0, 1000, &b0).ok());
  ASSERT_TRUE(Lease(2, 1, 1000, &b1).ok());
  EXPECT_EQ(b0.seg_no, a0.seg_no);
  EXPECT_EQ(b0.offset, a0.offset + sizeof(layout::ChunkHeader) + 128);
  EXPECT_EQ(b1.seg_no, a1.seg_no);
  EXPECT_EQ(b1.offset, a1.offset + sizeof(layout::ChunkHeader) + 256);
  // Releasing twice, or an unknown connection, is harmless.
  cache_->ReleaseConnection(1);
  cache_->ReleaseConnection(999);
}

TEST_F(CacheStateTest, RecycledTailTooSmallIsSkipped) {
  Create(64 * kMB);
  ChunkLease a;
  ASSERT_TRUE(Lease(1, 0, 1000, &a).ok());
  uint64_t tail_bytes = 64 * 1024;
  Chunk(a)->used.store(a.size - tail_bytes);
  cache_->Return(1, a.seg_no, a.offset);
  ChunkLease big;
  ASSERT_TRUE(Lease(2, 0, 1 * kMB, &big).ok());  // does not fit the tail
  EXPECT_FALSE(big.seg_no == a.seg_no && big.offset >= a.offset &&
               big.offset < a.offset + a.size);
  ChunkLease small;
  ASSERT_TRUE(Lease(2, 0, 1000, &small).ok());  // fits
  EXPECT_EQ(small.seg_no, a.seg_no);
  EXPECT_EQ(small.offset, a.offset + a.size - tail_bytes);
}

}  // namespace
}  // namespace shmcache
