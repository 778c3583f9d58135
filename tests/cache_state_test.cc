// The daemon's allocator: chunk leasing from per-node segments, the budget,
// recycling of chunk tails, index growth and destroy.
#include "cache_state.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "index_table.h"
#include "test_server.h"

namespace shmcache {
namespace {

using test::ListDir;

constexpr uint64_t kMB = 1 << 20;

class CacheStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shm_dir_ = test::MakeTempDir("/dev/shm", "shmcache-cs");
    run_dir_ = test::MakeTempDir(test::TestTmpRoot(), "cs");
    paths_ = MakeInstancePaths(40001, run_dir_, shm_dir_);
    account_.cap = 256 * kMB;
  }
  void TearDown() override {
    if (cache_) cache_->Destroy(&account_);
    EXPECT_EQ(account_.used, 0u) << "destroy released everything";
    EXPECT_TRUE(ListDir(shm_dir_).empty()) << testing::PrintToString(ListDir(shm_dir_));
    test::RemoveTree(shm_dir_);
    test::RemoveTree(run_dir_);
  }

  void Create(uint64_t budget, int nodes = 1, bool spilling = false) {
    Status s =
        CacheState::Create(paths_, kCacheId, /*session_id=*/77, "train", "fp-1", budget,
                           spilling, nodes, &account_, /*log=*/nullptr, &cache_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // Maps segment seg_no of the cache and returns its header (kept mapped).
  layout::SegmentHeader* Segment(uint32_t seg_no) {
    ShmFile f;
    Status s = ShmFile::Open(paths_.SegmentFile(kCacheId, seg_no), &f);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return nullptr;
    EXPECT_EQ(layout::CheckFileHeader(f.data(), f.size(), layout::kSegmentMagic,
                                      sizeof(layout::SegmentHeader)),
              nullptr);
    maps_.push_back(std::move(f));
    return reinterpret_cast<layout::SegmentHeader*>(maps_.back().data());
  }
  size_t SegmentSize(uint32_t seg_no) {
    Segment(seg_no);
    return maps_.back().size();
  }
  layout::ChunkHeader* Chunk(const ChunkLease& l) {
    auto* seg = reinterpret_cast<char*>(Segment(l.seg_no));
    return reinterpret_cast<layout::ChunkHeader*>(seg + l.offset);
  }
  Status Lease(uint64_t conn, int node, uint64_t need, ChunkLease* out) {
    return cache_->Lease(conn, node, need, &account_, out);
  }
  size_t SegmentFiles() {
    std::string prefix = paths_.SegmentFile(kCacheId, 0);
    prefix = prefix.substr(shm_dir_.size() + 1);
    prefix.pop_back();  // "...seg.<id>."
    size_t n = 0;
    for (const std::string& f : ListDir(shm_dir_)) n += f.rfind(prefix, 0) == 0;
    return n;
  }

  static constexpr uint32_t kCacheId = 5;
  std::string shm_dir_, run_dir_;
  InstancePaths paths_;
  MemoryAccount account_;
  std::unique_ptr<CacheState> cache_;
  std::vector<ShmFile> maps_;
};

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

// Leases 256 KB chunks until the lease fails; returns that status.
Status LeaseUntilRefused(CacheState* c, MemoryAccount* account) {
  Status s;
  for (int n = 0; n < 1000 && s.ok(); ++n) {
    ChunkLease l;
    s = c->Lease(1, 0, 256 * 1024, account, &l);
  }
  return s;
}

TEST_F(CacheStateTest, SpillingStoppedBeforeMemoryIsUsedUpFillsLikeAnyCache) {
  Create(8 * kMB, 1, /*spilling=*/true);
  cache_->StopSpilling("no spill store");
  EXPECT_FALSE(cache_->spill_enabled());
  EXPECT_FALSE(cache_->Stats().full) << "memory is still free";
  EXPECT_TRUE(LeaseUntilRefused(cache_.get(), &account_).IsFull());
  EXPECT_TRUE(cache_->Stats().full);
  EXPECT_FALSE(cache_->spilling());
}

TEST_F(CacheStateTest, DroppedSpilledRowsAreMissesAndTheCacheIsFullWithoutSpilling) {
  Create(8 * kMB, 1, /*spilling=*/true);
  EXPECT_EQ(cache_->DropSpilledRows(), 0u) << "nothing spilled yet";
  EXPECT_TRUE(LeaseUntilRefused(cache_.get(), &account_).IsFull());
  ASSERT_TRUE(cache_->spilling());
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

// What a previous daemon left is checked before it is used: a segment whose
// carved mark is off a cache line would hand out a misaligned chunk (found
// by fuzz_shm_headers).
TEST_F(CacheStateTest, AdoptionRefusesASegmentCarvedOffACacheLine) {
  Create(64 * kMB);
  ChunkLease a;
  ASSERT_TRUE(Lease(1, 0, 1000, &a).ok());
  MemoryAccount fresh;
  fresh.cap = 256 * kMB;
  std::unique_ptr<CacheState> adopted;
  ASSERT_TRUE(
      CacheState::Adopt(paths_, kCacheId, {a.seg_no}, 1, &fresh, nullptr, &adopted).ok());
  adopted.reset();
  fresh.Release(fresh.used);
  layout::SegmentHeader* seg = Segment(a.seg_no);
  seg->carved.store(seg->carved.load() - 2);  // inside the file, off a line
  Status s =
      CacheState::Adopt(paths_, kCacheId, {a.seg_no}, 1, &fresh, nullptr, &adopted);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_EQ(adopted, nullptr);
  seg->carved.store(seg->carved.load() + 2);
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

TEST_F(CacheStateTest, GrowIndexAddsADoubledTableOnce) {
  Create(64 * kMB);
  ShmFile header;
  ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header).ok());
  auto* h = reinterpret_cast<layout::CacheHeader*>(header.data());
  uint64_t cap0 = h->tables[0].capacity.load();
  uint64_t before = account_.used;
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  EXPECT_EQ(h->num_tables.load(), 2u);
  EXPECT_EQ(h->tables[1].capacity.load(), cap0 * 2);
  EXPECT_EQ(account_.used - before, layout::TableFileSize(cap0 * 2));
  // A second client that also saw one table does not grow it again.
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  EXPECT_EQ(h->num_tables.load(), 2u);
  ShmFile t1;
  ASSERT_TRUE(ShmFile::Open(paths_.TableFile(kCacheId, 1, h->tables[1].tag), &t1).ok());
  auto* th = reinterpret_cast<layout::TableHeader*>(t1.data());
  EXPECT_EQ(th->generation, 1u);
  EXPECT_EQ(th->capacity, cap0 * 2);
  EXPECT_EQ(IndexTable(th).Find(1), layout::kEmpty);
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
