// The daemon's allocator (segment_allocator.cc): chunks leased from
// per-node segments, formatted and disjoint, given back, and the unused
// tails of chunks recycled; a cache's memory: what is left of its budget
// and of the server's cap, when it is full, and when it takes rows again.
// Through a CacheState (CacheStateTest), then SegmentAllocator alone.
#include "daemon/segment_allocator.h"

#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon/cache_state.h"
#include "tests/support/cache_state_fixture.h"

namespace shmcache {
namespace {

constexpr uint64_t kKB = 1 << 10;

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
  uint64_t tail_bytes = 64 * kKB;
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

TEST_F(CacheStateTest, ChunksForAlikeRowsHoldWholeRowsWithNoTail) {
  // A decoded 224x224x3 float image, encoded: the rows of a first epoch.
  const uint64_t row = 602176;
  Create(256 * kMB);
  ChunkLease c;
  ASSERT_TRUE(Lease(1, 0, row, &c).ok());
  int whole = 0;
  for (int i = 0; i < 40; ++i) {
    SCOPED_TRACE(testing::Message() << "chunk " << i << " of " << c.size << " bytes");
    // The client's writes: rows while they fit.
    uint64_t used = sizeof(layout::ChunkHeader);
    while (c.size - used >= row) used += row;
    EXPECT_LE(c.size, SegmentAllocator::kChunkBytes);
    // A segment's last chunk is what was left of it; its tail is recycled
    // for a smaller row. Every other chunk is six rows.
    if (c.offset + c.size < SegmentSize(c.seg_no)) {
      EXPECT_EQ(used, sizeof(layout::ChunkHeader) + 6 * row);
      // Less than a page: a chunk ends on one (see CarveMarksLieOnPageBoundaries).
      EXPECT_LT(c.size - used, 4096u) << "a tail no row of this size fits";
      ++whole;
    }
    Chunk(c)->used.store(used);
    cache_->Return(1, c.seg_no, c.offset);
    ASSERT_TRUE(Lease(1, 0, row, &c).ok());
  }
  EXPECT_GE(whole, 30) << "few chunks end a segment";
}

TEST_F(CacheStateTest, CarveMarksLieOnPageBoundaries) {
  // A reader registers a segment with CUDA up to its carve mark, in whole
  // 4 KB pages (shmcache/torch/_cache_pages.py): a chunk that ended inside
  // a page would put its rows across two registered ranges.
  Create(256 * kMB);
  uint64_t carved = 0;
  for (uint64_t need : std::vector<uint64_t>{3000, 602176, 150000, 100, 5 * kMB, 3072}) {
    for (int i = 0; i < 5; ++i) {
      SCOPED_TRACE(testing::Message() << "row of " << need << ", chunk " << i);
      ChunkLease c;
      ASSERT_TRUE(Lease(1, 0, need, &c).ok());
      if (c.offset + c.size < SegmentSize(c.seg_no)) {  // else the segment's rest
        EXPECT_GE(c.size, SegmentAllocator::ChunkSizeFor(need));
        EXPECT_LT(c.size, SegmentAllocator::ChunkSizeFor(need) + 4096)
            << "at most a page less a line past the rows";
      }
      const uint64_t mark = Segment(c.seg_no)->carved.load();
      EXPECT_EQ(mark, c.offset + c.size);
      EXPECT_EQ(mark % 4096, 0u);
      carved += c.size;
    }
  }
  EXPECT_GT(carved, 20 * kMB);
}

TEST(SegmentAllocatorChunkSize, IsWholeRowsUpToTheChunkSizeAndOneRowPastIt) {
  const uint64_t header = sizeof(layout::ChunkHeader);
  EXPECT_EQ(SegmentAllocator::ChunkSizeFor(602176),
            layout::ChunkBytesFor(6 * uint64_t{602176}));
  EXPECT_EQ(
      SegmentAllocator::ChunkSizeFor(3072),
      layout::ChunkBytesFor((SegmentAllocator::kChunkBytes - header) / 3072 * 3072));
  EXPECT_EQ(SegmentAllocator::ChunkSizeFor(SegmentAllocator::kChunkBytes - header),
            SegmentAllocator::kChunkBytes);
  EXPECT_EQ(SegmentAllocator::ChunkSizeFor(10 * kMB), layout::ChunkBytesFor(10 * kMB));
  for (uint64_t need : {1ull, 100ull, 4096ull, 150000ull, 2100000ull}) {
    SCOPED_TRACE(need);
    uint64_t size = SegmentAllocator::ChunkSizeFor(need);
    EXPECT_GE(size, header + need);
    EXPECT_LE(size, SegmentAllocator::kChunkBytes);
    EXPECT_EQ(size % layout::kCacheLine, 0u);
    EXPECT_LT((size - header) % need, layout::kCacheLine);
  }
}

// ---- A cache's memory: its budget and the server's cap.

TEST_F(CacheStateTest, BudgetUsedUpMeansFull) {
  Create(8 * kMB);
  uint64_t leased = 0;
  Status s;
  int n = 0;
  for (; n < 100; ++n) {
    ChunkLease l;
    s = Lease(1, 0, 256 * kKB, &l);
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

// Each writer of a small cache (each DataLoader worker is one) gets its
// chunk of the budget: one chunk took the whole of a 1 MB budget, the next
// writer's lease found none left and marked the cache full for all of them
// (2 workers cached 3 of the 1,267 rows of 856 bytes one process caches).
TEST_F(CacheStateTest, AWritersChunkLeavesTheOthersOfASmallBudgetTheirShare) {
  Create(1 * kMB);
  for (uint64_t conn = 1; conn <= SegmentAllocator::kChunksPerBudget; ++conn) {
    ChunkLease l;
    Status s = Lease(conn, 0, 856, &l);
    ASSERT_TRUE(s.ok()) << "writer " << conn << ": " << s.ToString();
    // A quarter of the budget, up to the next page.
    EXPECT_LT(l.size, 1 * kMB / SegmentAllocator::kChunksPerBudget + 4 * kKB);
  }
  EXPECT_FALSE(cache_->Stats().full);
}

// Where a lease's row lies past the room left to a chunk: its writer's
// `used` mark, or the end the allocator set when it took the chunk's end
// back (layout::kRoomTaken).
uint64_t ChunkEnd(const ChunkLease& l, layout::ChunkHeader* h) {
  const uint64_t used = h->used.load();
  return l.offset + ((used & layout::kRoomTaken) ? used & ~layout::kRoomTaken : l.size);
}

// More writers than a small budget has chunks (8 DataLoader workers on
// 1 MB, 16 on 4 MB): the chunks leased first took the budget, the fifth
// writer's lease found none left and marked the cache full, and the writers
// past the fourth cached nothing while the first ones ran out of rows with
// their chunks half empty (8 workers cached half of what one process
// caches). Now a chunk is a smaller share as more writers hold chunks, and
// once the budget is used up a lease takes half of the room another writer
// holds unused.
TEST_F(CacheStateTest, WritersPastTheChunksOfASmallBudgetGetRoomTheOthersHeld) {
  Create(1 * kMB);
  std::vector<ChunkLease> leases;
  for (uint64_t conn = 1; conn <= 16; ++conn) {
    ChunkLease l;
    Status s = Lease(conn, 0, 856, &l);
    ASSERT_TRUE(s.ok()) << "writer " << conn << ": " << s.ToString();
    if (conn > 2) {
      // A share of the budget for twice the writers that hold chunks (up to
      // the next page; a tail too small to leave is leased with it).
      EXPECT_LT(l.size,
                1 * kMB / (2 * conn) + SegmentAllocator::kMinRecycleBytes + 4 * kKB)
          << "writer " << conn;
    }
    leases.push_back(l);
  }
  EXPECT_FALSE(cache_->Stats().full);
  int taken = 0;
  for (size_t i = 0; i < leases.size(); ++i) {
    const ChunkLease& a = leases[i];
    taken += (Chunk(a)->used.load() & layout::kRoomTaken) != 0;
    for (size_t j = i + 1; j < leases.size(); ++j) {
      const ChunkLease& b = leases[j];
      bool disjoint = a.seg_no != b.seg_no || ChunkEnd(a, Chunk(a)) <= b.offset ||
                      ChunkEnd(b, Chunk(b)) <= a.offset;
      EXPECT_TRUE(disjoint) << i << " overlaps " << j;
    }
  }
  EXPECT_GT(taken, 0) << "the budget was used up before the last writers came";
  // Once no chunk holds a row in what is left of its room, the cache is
  // full.
  for (const ChunkLease& l : leases) {
    Chunk(l)->used.store((Chunk(l)->used.load() & layout::kRoomTaken)
                             ? Chunk(l)->used.load() & ~layout::kRoomTaken
                             : l.size);
  }
  ChunkLease l;
  EXPECT_TRUE(Lease(17, 0, 856, &l).IsFull());
}

// The writer whose chunk's end was taken returns the chunk without having
// written since: its tail is the room up to the new end only (the taken
// part is another writer's), and once it saw the take, up to its mark.
TEST_F(CacheStateTest, AChunkWhoseEndWasTakenGivesBackOnlyWhatItKept) {
  Create(1 * kMB);
  std::vector<ChunkLease> leases(8);
  for (uint64_t conn = 1; conn <= leases.size(); ++conn) {
    ASSERT_TRUE(Lease(conn, 0, 856, &leases[conn - 1]).ok()) << conn;
  }
  const auto victim =
      std::find_if(leases.begin(), leases.end(), [&](const ChunkLease& l) {
        return (Chunk(l)->used.load() & layout::kRoomTaken) != 0;
      });
  ASSERT_NE(victim, leases.end()) << "8 writers used up 1 MB";
  const uint64_t conn = static_cast<uint64_t>(victim - leases.begin()) + 1;
  const uint64_t end = Chunk(*victim)->used.load() & ~layout::kRoomTaken;
  const ChunkLease kept = *victim;
  leases.erase(victim);
  cache_->Return(conn, kept.seg_no, kept.offset);
  // The free tails are leased again, a writer's share at a time.
  bool found = false;
  for (int n = 0; n < 8 && !found; ++n) {
    ChunkLease again;
    ASSERT_TRUE(Lease(conn, 0, 856, &again).ok());
    for (const ChunkLease& other : leases) {
      EXPECT_TRUE(again.seg_no != other.seg_no ||
                  again.offset + again.size <= other.offset ||
                  ChunkEnd(other, Chunk(other)) <= again.offset)
          << "a lease overlaps room another writer holds";
    }
    if (again.seg_no == kept.seg_no &&
        again.offset == kept.offset + sizeof(layout::ChunkHeader)) {
      found = true;
      EXPECT_LE(again.offset + again.size, kept.offset + end)
          << "up to the end taken, not past it";
    }
    Chunk(again)->used.store(again.size);  // filled
  }
  EXPECT_TRUE(found) << "the room the writer kept, right after its header, is free again";
}

// The budget is the whole cache's, whichever NUMA node its segments are
// on. A writer on node 0 whose lease found the budget used up took room
// only from chunks on node 0, and with none there marked the cache full
// for every writer while node 1's writer held a whole chunk unused, or
// while node 1 held room given back (a false Full on a host of two nodes).
// Room on the writer's own node is still taken first.
TEST_F(CacheStateTest, ALeaseFindsRoomOnAnotherNodeBeforeTheCacheIsFull) {
  Create(4 * kMB, /*nodes=*/2);
  // A writer on node 1 fills chunks until the budget is used up (one
  // segment), and holds the last one empty.
  ChunkLease held;
  ASSERT_TRUE(Lease(1, 1, 856, &held).ok());
  const uint32_t seg = held.seg_no;
  while (Segment(seg)->carved.load() < SegmentSize(seg)) {
    Chunk(held)->used.store(held.size);
    ChunkLease next;
    ASSERT_TRUE(Lease(1, 1, 856, &next).ok());
    cache_->Return(1, held.seg_no, held.offset);
    held = next;
  }
  ChunkLease l;
  Status s = Lease(2, 0, 856, &l);
  ASSERT_TRUE(s.ok()) << "node 1's writer holds " << held.size
                      << " bytes unused: " << s.ToString();
  EXPECT_EQ(l.seg_no, seg);
  EXPECT_GE(l.offset, held.offset + sizeof(layout::ChunkHeader));
  EXPECT_LE(l.offset + l.size, held.offset + held.size);
  EXPECT_EQ(ChunkEnd(held, Chunk(held)), l.offset) << "taken from node 1's chunk";
  EXPECT_FALSE(cache_->Stats().full);
  // Node 1's writer goes: the room it kept is free, and a lease on node 0
  // finds it there.
  cache_->ReleaseConnection(1);
  ChunkLease freed;
  s = Lease(3, 0, 856, &freed);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(freed.seg_no, seg);
  EXPECT_EQ(freed.offset, held.offset + sizeof(layout::ChunkHeader));
}

TEST_F(CacheStateTest, ServerCapUsedUpMeansFull) {
  Create(64 * kMB);
  account_.cap = account_.used + 6 * kMB;  // room for about one segment
  Status s;
  for (int n = 0; n < 100 && s.ok(); ++n) {
    ChunkLease l;
    s = Lease(1, 0, 512 * kKB, &l);
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
  // Rows that use up the budget make it full, as ever: 5 MB ones until
  // none fits (each then refused alone while the rows of the cache's
  // average size still fit), then the small ones until they fill it.
  for (int n = 0; n < 100; ++n) {
    s = Lease(1, 0, 5 * kMB, &l);
    if (!s.ok()) break;
  }
  EXPECT_TRUE(s.IsTooLarge()) << s.ToString();
  s = LeaseUntilRefused(1000);
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_TRUE(cache_->Stats().full);
  EXPECT_LE(account_.used, cache_->reserved_bytes());
}

TEST_F(CacheStateTest, CacheTheCapMadeFullTakesRowsAgainWhenTheCapFrees) {
  Create(64 * kMB);
  account_.cap = account_.used + 6 * kMB;
  Status s;
  ChunkLease l;
  for (int n = 0; n < 100 && s.ok(); ++n) s = Lease(1, 0, 512 * kKB, &l);
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_FALSE(cache_->ResumeIfCapAllows(account_)) << "nothing was freed";
  account_.cap += 8 * kMB;  // as when another session's memory is released
  EXPECT_TRUE(cache_->ResumeIfCapAllows(account_));
  EXPECT_FALSE(cache_->Stats().full);
  EXPECT_TRUE(Lease(1, 0, 512 * kKB, &l).ok());
  account_.cap = 256 * kMB;
}

TEST_F(CacheStateTest, CacheItsBudgetMadeFullStaysFull) {
  Create(4 * kMB);
  Status s;
  ChunkLease l;
  for (int n = 0; n < 100 && s.ok(); ++n) s = Lease(1, 0, 512 * kKB, &l);
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_FALSE(cache_->ResumeIfCapAllows(account_));
  EXPECT_TRUE(cache_->Stats().full);
}

// ---- SegmentAllocator alone, over a header of its own (no cache files; the
// fixture's cache is not created).

class SegmentAllocatorTest : public CacheStateTest {
 protected:
  void SetUp() override {
    CacheStateTest::SetUp();
    header_ = std::make_unique<layout::CacheHeader>();
    alloc_ = std::make_unique<SegmentAllocator>(paths_, kCacheId, 1, /*log=*/nullptr);
    alloc_->Attach(header_.get(), kLabel, budget_);
  }
  void TearDown() override {
    alloc_->Release(nullptr);
    // What it reserved is the owning CacheState's to release.
    account_.Release(account_.used);
    CacheStateTest::TearDown();
  }

  static constexpr const char* kLabel = "cache 5 (session 77, 'train')";
  uint64_t budget_ = 8 * kMB;  // alloc_'s, set before SetUp
  std::unique_ptr<layout::CacheHeader> header_;
  std::unique_ptr<SegmentAllocator> alloc_;
};

TEST_F(SegmentAllocatorTest, SegmentsCountAgainstTheBudgetUntilReleased) {
  ChunkLease l;
  ASSERT_TRUE(alloc_->Lease(1, 0, 3000, &account_, &l).ok());
  EXPECT_GE(alloc_->data_bytes(), layout::kMinSegmentBytes);
  EXPECT_LE(alloc_->data_bytes(), 8 * kMB);
  EXPECT_EQ(account_.used, alloc_->data_bytes()) << "reserved in the account";
  EXPECT_EQ(ListDir(shm_dir_).size(), 1u) << "one segment file";
  EXPECT_EQ(alloc_->Release(nullptr), 0u) << "no held files asked for";
  EXPECT_EQ(alloc_->data_bytes(), 0u);
  EXPECT_TRUE(ListDir(shm_dir_).empty());
  Status s = alloc_->Lease(1, 0, 3000, &account_, &l);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
}

TEST_F(SegmentAllocatorTest, TailsAreRecycledOnlyWhenTheProcessIsGone) {
  const auto tail_of = [](const ChunkLease& l) {
    return (l.offset + sizeof(layout::ChunkHeader) + layout::kCacheLine - 1) /
           layout::kCacheLine * layout::kCacheLine;
  };
  ChunkLease a, c, d;
  ASSERT_TRUE(alloc_->Lease(1, 0, 3000, &account_, &a).ok());
  alloc_->ReleaseConnection(1, /*recycle=*/false);
  ASSERT_TRUE(alloc_->Lease(2, 0, 3000, &account_, &c).ok());
  EXPECT_FALSE(c.seg_no == a.seg_no && c.offset == tail_of(a))
      << "a live process may still write into its chunk";
  alloc_->ReleaseConnection(2, /*recycle=*/true);
  ASSERT_TRUE(alloc_->Lease(3, 0, 3000, &account_, &d).ok());
  EXPECT_EQ(d.seg_no, c.seg_no);
  EXPECT_EQ(d.offset, tail_of(c));
  EXPECT_EQ(d.offset + d.size, c.offset + c.size);
}

TEST_F(SegmentAllocatorTest, AdoptsAFinishedSegmentAndRemovesAnUnfinishedOne) {
  const uint64_t size = layout::kMinSegmentBytes;
  ShmFile done, unfinished;
  ASSERT_TRUE(
      SegmentAllocator::CreateSegmentFile(paths_, kCacheId, 0, 0, size, &done).ok());
  ASSERT_TRUE(
      SegmentAllocator::CreateSegmentFile(paths_, kCacheId, 1, 0, size, &unfinished)
          .ok());
  reinterpret_cast<layout::FileHeader*>(unfinished.data())->magic = 0;
  done.Unmap();
  unfinished.Unmap();
  SegmentAllocator adopter(paths_, kCacheId, 1, /*log=*/nullptr);
  adopter.Attach(header_.get(), kLabel, 8 * kMB);
  ASSERT_TRUE(adopter.AdoptSegment(0).ok());
  ASSERT_TRUE(adopter.AdoptSegment(1).ok());
  EXPECT_EQ(adopter.data_bytes(), size) << "only the finished one counts";
  EXPECT_EQ(ListDir(shm_dir_).size(), 1u) << testing::PrintToString(ListDir(shm_dir_));
  // What the earlier server never carved is handed out again.
  ChunkLease l;
  ASSERT_TRUE(adopter.Lease(1, 0, 3000, &account_, &l).ok());
  EXPECT_EQ(l.seg_no, 0u);
  EXPECT_EQ(l.offset, layout::kSegmentHeaderSize);
  adopter.Release(nullptr);
}

// Runs a job of either kind as a preparer thread does, and hands it back.
void RunJob(const InstancePaths& paths, SegmentAllocator* alloc, const SegmentJob& job,
            MemoryAccount* account) {
  ShmFile f;
  Status made = SegmentAllocator::RunSegmentJob(paths, job, &f);
  ASSERT_TRUE(made.ok()) << made.ToString();
  alloc->FinishSegmentJob(job, made, std::move(f), account);
}

// A writer on `node` leases a chunk for one row of `row` bytes (made on
// the spot), and the one segment made ahead after it is made: *ahead.
void LeaseAndMakeAhead(const InstancePaths& paths, SegmentAllocator* alloc, int node,
                       uint64_t row, MemoryAccount* account, ChunkLease* lease,
                       SegmentJob* ahead) {
  ASSERT_TRUE(alloc->Lease(1, node, row, account, lease).ok());
  std::vector<SegmentJob> made = alloc->TakeSegmentJobs(node, account, 1);
  ASSERT_EQ(made.size(), 1u);
  *ahead = made[0];
  ASSERT_NO_FATAL_FAILURE(RunJob(paths, alloc, *ahead, account));
}

TEST_F(SegmentAllocatorTest, SegmentsAreMadeByMoreThreadsOnceAWriterWaitedForOne) {
  SegmentAllocator alloc(paths_, kCacheId, 1, /*log=*/nullptr);
  alloc.Attach(header_.get(), kLabel, 512 * kMB);
  // A first segment of 32 MB, made on the spot and carved whole.
  ChunkLease big;
  ASSERT_TRUE(alloc.Lease(1, 0, 30 * kMB, &account_, &big).ok());
  const uint64_t held = alloc.data_bytes();
  // One writer so far: one segment ahead, a quarter of what the cache holds.
  std::vector<SegmentJob> first = alloc.TakeSegmentJobs(0, &account_, 4);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].size, held / 4);
  EXPECT_TRUE(alloc.TakeSegmentJobs(0, &account_, 4).empty()) << "one batch at a time";
  // The writer needs it before it is made (once the first segment's tail
  // is leased too): it waits.
  ChunkLease l;
  bool wait = false;
  for (int i = 0; i < 4 && !wait; ++i) {
    ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &l, &wait).ok());
  }
  ASSERT_TRUE(wait);
  ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, first[0], &account_));
  ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &l, &wait).ok());
  ASSERT_FALSE(wait);
  EXPECT_EQ(l.seg_no, first[0].seg_no);
  // The next batch: the same bytes, in two segments made at once.
  const uint64_t before = account_.used;
  std::vector<SegmentJob> second = alloc.TakeSegmentJobs(0, &account_, 4);
  ASSERT_EQ(second.size(), 2u);
  uint64_t total = 0;
  for (const SegmentJob& j : second) {
    EXPECT_GE(j.size, layout::kMinSegmentBytes);
    EXPECT_EQ(j.size % 4096, 0u);
    total += j.size;
  }
  EXPECT_EQ(total, (alloc.data_bytes() - total) / 4 / kMB * kMB)
      << "a quarter of what the cache held, as one segment would be";
  EXPECT_EQ(account_.used - before, total) << "reserved as soon as named";
  // Finished in the other order, handed out in the order named.
  ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, second[1], &account_));
  ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, second[0], &account_));
  std::vector<uint32_t> segs;
  for (int i = 0; i < 16 && segs.size() < 3; ++i) {
    ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &l).ok());
    if (segs.empty() || segs.back() != l.seg_no) segs.push_back(l.seg_no);
  }
  EXPECT_EQ(segs,
            (std::vector<uint32_t>{first[0].seg_no, second[0].seg_no, second[1].seg_no}));
  // Never more jobs than threads to run them.
  EXPECT_LE(alloc.TakeSegmentJobs(0, &account_, 1).size(), 1u);
  alloc.Release(nullptr);
}

// Bytes of the file's pages that are allocated (st_blocks).
uint64_t AllocatedBytes(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

TEST_F(SegmentAllocatorTest, ChunksComeOnlyFromPagesSuppliedAStepAheadOfTheCarveMark) {
  SegmentAllocator alloc(paths_, kCacheId, 1, /*log=*/nullptr);
  alloc.Attach(header_.get(), kLabel, 250 * kMB);
  // The next segment, a quarter of what the cache holds, is made sparse:
  // only its header and kSupplyAhead are supplied.
  ChunkLease big;
  SegmentJob next{};
  ASSERT_NO_FATAL_FAILURE(
      LeaseAndMakeAhead(paths_, &alloc, 0, 160 * kMB, &account_, &big, &next));
  ASSERT_GT(next.size, 2 * SegmentAllocator::kSupplyAhead);
  const std::string path = paths_.SegmentFile(kCacheId, next.seg_no);
  const uint64_t first = SegmentAllocator::FirstSupply(next.size);
  EXPECT_EQ(first, 18 * kMB);
  EXPECT_EQ(AllocatedBytes(path), first);
  // Writers lease 4 MB chunks from it until the supplied pages run out;
  // the lease that would go past them waits for the supply job instead.
  std::vector<SegmentJob> supply;
  ChunkLease l;
  bool wait = false;
  for (int i = 0; i < 32 && !wait; ++i) {
    ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &l, &wait).ok());
    if (!wait && l.seg_no == next.seg_no) {
      EXPECT_LE(l.offset + l.size, first) << "only supplied pages are leased";
    }
    // The first segment's rest is supplied at once; the next one's kept.
    for (const SegmentJob& j : alloc.TakeSupplyJobs(0)) {
      if (j.seg_no == next.seg_no) {
        supply.push_back(j);
      } else {
        ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, j, &account_));
      }
    }
  }
  ASSERT_TRUE(wait);
  ASSERT_EQ(supply.size(), 1u) << "one supply job at a time per segment";
  EXPECT_FALSE(supply[0].create);
  EXPECT_EQ(supply[0].supply_from, first);
  EXPECT_EQ(supply[0].supply_to, first + SegmentAllocator::kSupplyStep);
  ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, supply[0], &account_));
  EXPECT_EQ(AllocatedBytes(path), supply[0].supply_to);
  ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &l, &wait).ok());
  ASSERT_FALSE(wait);
  EXPECT_EQ(l.seg_no, next.seg_no);
  EXPECT_LE(l.offset + l.size, supply[0].supply_to);
  // A supply job that finds no room in the shm dir (another user filled it)
  // fails the lease that needs its pages as Full, and the cache is full for
  // every client; what was leased stays.
  std::vector<SegmentJob> more = alloc.TakeSupplyJobs(0);
  ASSERT_EQ(more.size(), 1u);
  alloc.FinishSegmentJob(more[0], Status::FullNoShmRoom("no room in the test's shm dir"),
                         ShmFile(), &account_);
  Status s = Status::OK();
  for (int i = 0; i < 16 && s.ok(); ++i)
    s = alloc.Lease(1, 0, 3000, &account_, &l, &wait);
  EXPECT_TRUE(s.IsFullNoShmRoom()) << s.ToString();
  EXPECT_TRUE(header_->state.load() & layout::kStateFull);
  EXPECT_TRUE(alloc.Lease(2, 0, 3000, &account_, &l, &wait).IsFull());
  EXPECT_LE(AllocatedBytes(path), supply[0].supply_to);
  alloc.Release(nullptr);
}

TEST_F(SegmentAllocatorTest, WritersThatOutrunTheSupplyOpenTheNextSegmentBesideIt) {
  SegmentAllocator alloc(paths_, kCacheId, 1, /*log=*/nullptr);
  alloc.Attach(header_.get(), kLabel, 250 * kMB);
  ChunkLease l;
  std::vector<SegmentJob> b(1);
  ASSERT_NO_FATAL_FAILURE(
      LeaseAndMakeAhead(paths_, &alloc, 0, 160 * kMB, &account_, &l, &b[0]));
  // A writer fills segment b; its supply jobs run when it waits for them,
  // until the segment after it is named (and made).
  std::vector<SegmentJob> held, c;
  bool wait = false;
  for (int i = 0; i < 64 && c.empty(); ++i) {
    ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &l, &wait).ok());
    for (const SegmentJob& j : alloc.TakeSupplyJobs(0)) held.push_back(j);
    if (wait) {
      for (const SegmentJob& j : held) {
        ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, j, &account_));
      }
      held.clear();
      continue;
    }
    c = alloc.TakeSegmentJobs(0, &account_, 1);
  }
  ASSERT_EQ(c.size(), 1u);
  ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, c[0], &account_));
  // Now b's supply lags (its jobs are held back): rather than wait for it,
  // the writer goes on in c, opened beside b, whose pages a job of its own
  // supplies meanwhile.
  bool in_c = false;
  for (int i = 0; i < 16 && !in_c; ++i) {
    ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &l, &wait).ok());
    ASSERT_FALSE(wait) << "lease " << i << " waited for b's pages";
    for (const SegmentJob& j : alloc.TakeSupplyJobs(0)) held.push_back(j);
    in_c = l.seg_no == c[0].seg_no;
  }
  ASSERT_TRUE(in_c);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].seg_no, b[0].seg_no);
  EXPECT_EQ(held[1].seg_no, c[0].seg_no);
  for (const SegmentJob& j : held) {
    ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, j, &account_));
  }
  // b's pages supplied again, its rest is leased before c's.
  ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &l, &wait).ok());
  ASSERT_FALSE(wait);
  EXPECT_EQ(l.seg_no, b[0].seg_no);
  alloc.Release(nullptr);
}

// Writers of one tmpfs file take turns: a pwritev and the supply's
// fallocate each take the file's lock, so writers that share a segment
// write one at a time and are supplied by one thread (issue 36: PutBatch by
// 2 processes filled no faster than by one). A writer leases from a
// segment no other connection holds a chunk in when one is open or made
// ahead; only when none is do writers share one, and never does that make
// a lease wait or fail.
TEST_F(SegmentAllocatorTest, EachWriterLeasesFromASegmentOfItsOwnWhereOneIsThere) {
  SegmentAllocator alloc(paths_, kCacheId, 1, /*log=*/nullptr);
  alloc.Attach(header_.get(), kLabel, 8 * kMB);
  ChunkLease a;
  ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &a).ok());
  std::vector<SegmentJob> ahead = alloc.TakeSegmentJobs(0, &account_, 4);
  ASSERT_EQ(ahead.size(), 1u);
  ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, ahead[0], &account_));
  // Writer 1's segment has room left, and one is made ahead: writer 2
  // gets that one.
  ChunkLease b;
  bool wait = false;
  ASSERT_TRUE(alloc.Lease(2, 0, 3000, &account_, &b, &wait).ok());
  ASSERT_FALSE(wait);
  EXPECT_NE(b.seg_no, a.seg_no) << "writer 2 was leased writer 1's segment";
  EXPECT_EQ(b.seg_no, ahead[0].seg_no);
  // Writer 1, its chunk written and given back (as a lease with has_old
  // does), goes on in its own segment.
  Chunk(a)->used.store(a.size);
  alloc.Return(1, a.seg_no, a.offset);
  ChunkLease a2;
  ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &a2, &wait).ok());
  ASSERT_FALSE(wait);
  EXPECT_EQ(a2.seg_no, a.seg_no);
  // The budget is used up: a third writer shares a segment rather than
  // wait or find the cache full.
  ChunkLease c;
  Status s = alloc.Lease(3, 0, 3000, &account_, &c, &wait);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(wait);
  alloc.Release(nullptr);
}

TEST_F(SegmentAllocatorTest, WritersThatShareASegmentGetOneEachInTheNextBatchMadeAhead) {
  SegmentAllocator alloc(paths_, kCacheId, 1, /*log=*/nullptr);
  alloc.Attach(header_.get(), kLabel, 512 * kMB);
  // A first segment carved whole by one large row, and one made ahead.
  ChunkLease big;
  std::vector<SegmentJob> first(1);
  ASSERT_NO_FATAL_FAILURE(
      LeaseAndMakeAhead(paths_, &alloc, 0, 30 * kMB, &account_, &big, &first[0]));
  // Its writer goes on with small rows, each chunk written and given back
  // (as a lease with has_old does), into the segment made ahead.
  ChunkLease a = big, b;
  bool wait = false;
  for (int i = 0; i < 8 && a.seg_no != first[0].seg_no; ++i) {
    Chunk(a)->used.store(a.size);
    alloc.Return(1, a.seg_no, a.offset);
    ASSERT_TRUE(alloc.Lease(1, 0, 3000, &account_, &a, &wait).ok());
    ASSERT_FALSE(wait);
  }
  ASSERT_EQ(a.seg_no, first[0].seg_no);
  // A second writer, with no segment to itself and none made ahead,
  // shares that one, without waiting for anything.
  ASSERT_TRUE(alloc.Lease(2, 0, 3000, &account_, &b, &wait).ok());
  ASSERT_FALSE(wait);
  EXPECT_EQ(b.seg_no, a.seg_no);
  // The next batch made ahead has a segment for each of them (one while
  // no writer had waited: SegmentsAreMadeByMoreThreadsOnceAWriterWaitedForOne).
  std::vector<SegmentJob> next = alloc.TakeSegmentJobs(0, &account_, 4);
  EXPECT_EQ(next.size(), 2u);
  for (const SegmentJob& j : next) {
    ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, j, &account_));
  }
  alloc.Release(nullptr);
}

// Another node's segments count in the budget whether its writers lease
// from them or not: a segment made ahead for node 1 (a quarter of what the
// cache holds) and the pages of node 1's open segment not yet supplied were
// never leased to a writer on node 0, whose cache was marked full with
// them unused (a false Full on a host of two nodes, once node 1's writers
// had finished). The lease opens the segment made ahead there, and waits
// for a supply job of node 1 (Store::LeaseChunk takes every node's jobs
// when a lease waits) for the rest.
TEST_F(SegmentAllocatorTest,
       ALeaseTakesAnotherNodesSegmentsMadeAheadBeforeTheCacheIsFull) {
  SegmentAllocator alloc(paths_, kCacheId, 2, /*log=*/nullptr);
  constexpr uint64_t kNodeZeroBytes = 8 * kMB;
  // Node 1's writer puts one large row, and its next segment is made.
  alloc.Attach(header_.get(), kLabel, 256 * kMB);
  ChunkLease big;
  std::vector<SegmentJob> ahead(1);
  ASSERT_NO_FATAL_FAILURE(
      LeaseAndMakeAhead(paths_, &alloc, 1, 80 * kMB, &account_, &big, &ahead[0]));
  const uint64_t first_supply = SegmentAllocator::FirstSupply(ahead[0].size);
  ASSERT_LT(first_supply, ahead[0].size) << "a rest to be supplied";
  // The budget (set again now that what node 1 holds is known) leaves
  // node 0 a segment of its own, then is used up.
  alloc.Attach(header_.get(), kLabel, alloc.data_bytes() + kNodeZeroBytes);
  Chunk(big)->used.store(big.size);  // written whole: nothing to take back
  // Node 0's writer leases 3 KB rows' chunks until refused, running the
  // jobs a waiting lease asks for, as the store's preparers do.
  uint64_t leased = 0, past_first_supply = 0;
  bool in_ahead = false;
  Status s;
  for (int i = 0; i < 200; ++i) {
    ChunkLease l;
    bool wait = false;
    s = alloc.Lease(2, 0, 3000, &account_, &l, &wait);
    if (!s.ok()) break;
    if (wait) {
      for (int node = 0; node < 2; ++node) {
        for (const SegmentJob& j : alloc.TakeSupplyJobs(node)) {
          ASSERT_NO_FATAL_FAILURE(RunJob(paths_, &alloc, j, &account_));
        }
      }
      continue;
    }
    leased += l.size;
    if (l.seg_no == ahead[0].seg_no) {
      in_ahead = true;
      if (l.offset + l.size > first_supply) past_first_supply += l.size;
    }
    Chunk(l)->used.store(l.size);
  }
  EXPECT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_TRUE(in_ahead) << "node 1's segment made ahead was never leased; " << leased
                        << " bytes leased to node 0 before " << s.ToString();
  EXPECT_GT(past_first_supply, 0u) << "its pages past the first supply were not";
  EXPECT_GE(leased, kNodeZeroBytes + ahead[0].size - 2 * SegmentAllocator::kChunkBytes);
  alloc.Release(nullptr);
}

TEST_F(SegmentAllocatorTest, AdoptedSegmentMadeAheadIsHandedOutAfterTheCurrentOne) {
  const uint64_t size = layout::kMinSegmentBytes;
  ShmFile used, ahead;
  ASSERT_TRUE(
      SegmentAllocator::CreateSegmentFile(paths_, kCacheId, 0, 0, size, &used).ok());
  ASSERT_TRUE(
      SegmentAllocator::CreateSegmentFile(paths_, kCacheId, 1, 0, size, &ahead).ok());
  // The earlier server carved half of segment 0 and made segment 1 ahead.
  const uint64_t carved = size / 2;
  reinterpret_cast<layout::SegmentHeader*>(used.data())->carved.store(carved);
  used.Unmap();
  ahead.Unmap();
  SegmentAllocator adopter(paths_, kCacheId, 1, /*log=*/nullptr);
  adopter.Attach(header_.get(), kLabel, 8 * kMB);
  ASSERT_TRUE(adopter.AdoptSegment(0).ok());
  ASSERT_TRUE(adopter.AdoptSegment(1).ok());
  EXPECT_EQ(adopter.data_bytes(), 2 * size);
  ChunkLease a, b;
  ASSERT_TRUE(adopter.Lease(1, 0, 3000, &account_, &a).ok());
  EXPECT_EQ(a.seg_no, 0u) << "the rest of the segment the earlier server carved";
  EXPECT_EQ(a.offset, carved);
  ASSERT_TRUE(adopter.Lease(1, 0, 3000, &account_, &b).ok());
  EXPECT_EQ(b.seg_no, 1u) << "then the one it made ahead, not a new one";
  EXPECT_EQ(b.offset, layout::kSegmentHeaderSize);
  EXPECT_EQ(ListDir(shm_dir_).size(), 2u) << testing::PrintToString(ListDir(shm_dir_));
  adopter.Release(nullptr);
}

TEST_F(SegmentAllocatorTest, AnAdoptedCarveMarkOffAPageIsBroughtOntoOneByTheNextChunk) {
  const uint64_t size = 4 * layout::kMinSegmentBytes;
  ShmFile used;
  ASSERT_TRUE(
      SegmentAllocator::CreateSegmentFile(paths_, kCacheId, 0, 0, size, &used).ok());
  // An older build carved chunks that ended on cache lines, not pages.
  const uint64_t carved = size / 4 + 5 * layout::kCacheLine;
  auto* sh = reinterpret_cast<layout::SegmentHeader*>(used.data());
  sh->carved.store(carved);
  SegmentAllocator adopter(paths_, kCacheId, 1, /*log=*/nullptr);
  adopter.Attach(header_.get(), kLabel, 32 * kMB);
  ASSERT_TRUE(adopter.AdoptSegment(0).ok());
  ChunkLease a;
  ASSERT_TRUE(adopter.Lease(1, 0, 3000, &account_, &a).ok());
  EXPECT_EQ(a.seg_no, 0u);
  EXPECT_EQ(a.offset, carved);
  EXPECT_GE(a.size, SegmentAllocator::ChunkSizeFor(3000));
  EXPECT_EQ(sh->carved.load(), a.offset + a.size);
  EXPECT_EQ(sh->carved.load() % 4096, 0u);
  used.Unmap();
  adopter.Release(nullptr);
}

// A server killed while two segments were open (its writers outran the
// first one's page supply and went on in the next beside it): the restarted
// server carves the rest of both, oldest first, as the killed one would
// have; it used to carve on from the last one only, and the budget went on
// counting the first one's rest. A rest that holds no chunk is left, as it
// was when the next segment was opened.
TEST_F(SegmentAllocatorTest, AdoptedSegmentsOpenBesideTheLastKeepTheirRestsInUse) {
  const uint64_t size = 32 * kMB;
  ShmFile files[3];
  for (uint32_t no = 0; no < 3; ++no) {
    ASSERT_TRUE(SegmentAllocator::CreateSegmentFile(paths_, kCacheId, no, 0, size,
                                                    &files[no], 2 * kMB)
                    .ok());
  }
  // 0: carved up to a rest under a chunk; 1: half carved (open beside 2);
  // 2: carved a quarter, the last carved.
  const uint64_t carved[3] = {size - 2 * kMB, size / 2, size / 4};
  for (uint32_t no = 0; no < 3; ++no) {
    reinterpret_cast<layout::SegmentHeader*>(files[no].data())->carved.store(carved[no]);
    files[no].Unmap();
  }
  SegmentAllocator adopter(paths_, kCacheId, 1, /*log=*/nullptr);
  adopter.Attach(header_.get(), kLabel, 128 * kMB);
  for (uint32_t no = 0; no < 3; ++no) ASSERT_TRUE(adopter.AdoptSegment(no).ok());
  ChunkLease l;
  uint64_t from_1 = 0;
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(adopter.Lease(1, 0, 100 * kKB, &account_, &l).ok());
    EXPECT_NE(l.seg_no, 0u) << "a rest that holds no chunk is left";
    if (l.seg_no != 1) break;
    EXPECT_EQ(l.offset, carved[1] + from_1);
    from_1 += l.size;
  }
  EXPECT_EQ(from_1, size - carved[1]) << "segment 1's rest, carved whole before 2's";
  EXPECT_EQ(l.seg_no, 2u);
  EXPECT_EQ(l.offset, carved[2]);
  adopter.Release(nullptr);
}

// ---- A row no room left holds: TooLarge while rows of the size the cache
// took still fit (its writers' counts in the header's stats), else Full.

// Rows of `row_bytes` each, as the writers counted them.
void CountRows(layout::CacheHeader* header, uint64_t rows, uint64_t row_bytes) {
  header->stats[0].rows.store(rows);
  header->stats[0].bytes.store(rows * row_bytes);
}

// A cache of 4 MB: its whole budget is one segment.
class FourMBAllocatorTest : public SegmentAllocatorTest {
 protected:
  FourMBAllocatorTest() { budget_ = 4 * kMB; }
};

// The budget (4 MB) is one segment, leased whole in chunks (a quarter of
// the budget each) that rows filled but for 20 KB of the last: given back,
// that tail is all the room a row has. The most one row can take (the tail
// less its chunk header) is named as it is, not as '0.0 MB'.
TEST_F(FourMBAllocatorTest, TheMostARowCanTakeIsNamedInKBWhereMBWouldRoundItAway) {
  ChunkLease l;
  do {
    ASSERT_TRUE(alloc_->Lease(1, 0, 1000, &account_, &l).ok());
    Chunk(l)->used.store(l.size);
  } while (l.offset + l.size < alloc_->data_bytes());
  Chunk(l)->used.store(l.size - 20 * kKB);
  alloc_->Return(1, l.seg_no, l.offset);
  CountRows(header_.get(), 100, 1000);
  Status s = alloc_->Lease(2, 0, 100 * kKB, &account_, &l);
  ASSERT_TRUE(s.IsTooLarge()) << s.ToString();
  EXPECT_NE(s.message().find("a row of 100 KB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("the most one row can take in it now is 20 KB"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("0.0 MB"), std::string::npos) << s.message();
  ASSERT_TRUE(alloc_->Lease(2, 0, 1000, &account_, &l).ok()) << "the tail holds rows";
}

// A 4 MB budget in one segment whose first chunks (of a 1.5 MB row each:
// a chunk is at most a quarter of the budget, or one row) left about 1 MB
// uncarved. A 2 MB row finds no room; the 100 KB rows the cache took still
// fit in that rest: TooLarge, and the rest still takes them (it was
// dropped from the open segments first, so the cache was Full).
TEST_F(FourMBAllocatorTest, ARowTooLargeForTheOpenSegmentsRestLeavesItToSmallerRows) {
  ChunkLease l;
  ASSERT_TRUE(alloc_->Lease(1, 0, 3 * kMB / 2, &account_, &l).ok());
  ASSERT_TRUE(alloc_->Lease(1, 0, 3 * kMB / 2, &account_, &l).ok());
  const uint64_t rest = alloc_->data_bytes() - (l.offset + l.size);
  ASSERT_GE(rest, 512 * 1024u) << "the segment has room left past the chunk";
  CountRows(header_.get(), 10, 100 * kKB);
  Status s = alloc_->Lease(1, 0, 2 * kMB, &account_, &l);
  ASSERT_TRUE(s.IsTooLarge()) << s.ToString();
  EXPECT_NE(
      s.message().find(fmt::format("the most one row can take in it now is {} KB",
                                   (rest - sizeof(layout::ChunkHeader) + 512) / 1024)),
      std::string::npos)
      << s.message();
  EXPECT_FALSE(header_->state.load() & layout::kStateFull);
  EXPECT_TRUE(alloc_->Lease(2, 0, 100 * kKB, &account_, &l).ok());
}

// No row counted yet (a writer counts once per window of rows, or before
// its next lease: the rows of another's batch in flight are not): a row
// that finds no room where a smaller one would is refused alone, not what
// makes the cache refuse every row after it. A cache whose rows leave no
// room at all is full all the same.
TEST_F(FourMBAllocatorTest, ARowTooLargeBeforeAnyRowWasCountedIsTooLargeNotFull) {
  ChunkLease l;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(alloc_->Lease(1, 0, 3 * kMB / 2, &account_, &l).ok());
    Chunk(l)->used.store(l.size);  // its row written
  }
  Status s = alloc_->Lease(2, 0, 2 * kMB, &account_, &l);
  ASSERT_TRUE(s.IsTooLarge()) << s.ToString();
  EXPECT_FALSE(header_->state.load() & layout::kStateFull);
  EXPECT_TRUE(alloc_->Lease(2, 0, 100 * kKB, &account_, &l).ok());
  Status full;
  for (int i = 0; i < 100 && full.ok(); ++i) {
    full = alloc_->Lease(2, 0, 100 * kKB, &account_, &l);
  }
  EXPECT_TRUE(full.IsFull()) << full.ToString();
}

}  // namespace
}  // namespace shmcache
