// StatsLanes: where a process counts its reads and puts, over a cache
// header in shared anonymous memory (a forked child writes into the same
// one). Every count is checked through ReadCacheStats, as the listings and
// GetStats read them, and where it went (lane or slot) is checked too.
#include "lib/stats_lanes.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <new>
#include <thread>

#include <gtest/gtest.h>

#include "format/cache_stats.h"

namespace shmcache {
namespace {

class StatsLanesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    void* p = mmap(nullptr, sizeof(layout::CacheHeader), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    header_ = new (p) layout::CacheHeader();
  }
  void TearDown() override { munmap(header_, sizeof(layout::CacheHeader)); }
  CacheStats Read(bool single_node = true) const {
    return ReadCacheStats(*header_, single_node);
  }
  static uint64_t Me() { return static_cast<uint64_t>(getpid()); }

  layout::CacheHeader* header_ = nullptr;
};

TEST_F(StatsLanesTest, TheFirstThreadCountsInTheLaneOthersInTheSlot) {
  StatsLanes lanes(header_, /*client_id=*/3, /*single_node=*/true);
  EXPECT_EQ(header_->lanes[3].owner.load(), Me());
  for (int i = 0; i < 5; ++i) lanes.CountHit(0);
  lanes.CountRead(false, 0);
  EXPECT_EQ(header_->lanes[3].hits.load(), 5u);
  EXPECT_EQ(header_->lanes[3].misses.load(), 1u);
  std::thread([&] {
    lanes.CountHit(0);
    lanes.CountHit(0);
    lanes.CountRead(false, 0);
  }).join();
  EXPECT_EQ(header_->stats[3].hits.load(), 2u) << "another thread: the slot";
  EXPECT_EQ(header_->stats[3].misses.load(), 1u);
  const CacheStats st = Read();
  EXPECT_EQ(st.hits, 7u);
  EXPECT_EQ(st.misses, 2u);
  EXPECT_EQ(st.numa_hits, 7u) << "one node: every hit";
}

TEST_F(StatsLanesTest, ABatchOfReadsIsCountedAtOnceInTheLaneOrTheSlot) {
  StatsLanes lanes(header_, 3, /*single_node=*/false);
  EXPECT_TRUE(lanes.LocalHit(0)) << "this host's one node is the reader's";
  EXPECT_FALSE(lanes.LocalHit(-1)) << "a row from disk";
  lanes.CountReads(/*hits=*/30, /*local_hits=*/20, /*misses=*/2);
  EXPECT_EQ(header_->lanes[3].hits.load(), 30u);
  EXPECT_EQ(header_->lanes[3].numa_hits.load(), 20u);
  EXPECT_EQ(header_->lanes[3].misses.load(), 2u);
  std::thread([&] { lanes.CountReads(5, 4, 1); }).join();
  EXPECT_EQ(header_->stats[3].hits.load(), 5u) << "another thread: the slot";
  EXPECT_EQ(header_->stats[3].numa_hits.load(), 4u);
  EXPECT_EQ(header_->stats[3].misses.load(), 1u);
  const CacheStats st = Read(/*single_node=*/false);
  EXPECT_EQ(st.hits, 35u);
  EXPECT_EQ(st.numa_hits, 24u);
  EXPECT_EQ(st.misses, 3u);
  StatsLanes one_node(header_, 4, /*single_node=*/true);
  EXPECT_FALSE(one_node.LocalHit(0)) << "one node: the readers count them";
}

TEST_F(StatsLanesTest, ASecondOpeningInOneProcessHasNoLane) {
  StatsLanes first(header_, 3, true);
  StatsLanes second(header_, 3 + layout::kStatsSlots, true);  // the same lane
  second.CountHit(0);
  second.CountSpillReads(4);
  first.CountHit(0);
  EXPECT_EQ(header_->lanes[3].hits.load(), 1u);
  EXPECT_EQ(header_->stats[3].hits.load(), 1u);
  EXPECT_EQ(Read().hits, 2u);
  EXPECT_EQ(Read().spill_reads, 0u) << "counted in a lane only";
}

TEST_F(StatsLanesTest, ALaneWhoseOwnerIsGoneIsTakenWithItsCounts) {
  pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  header_->lanes[5].owner.store(static_cast<uint64_t>(gone));
  header_->lanes[5].hits.store(10);
  StatsLanes lanes(header_, 5, true);
  EXPECT_EQ(header_->lanes[5].owner.load(), Me());
  lanes.CountHit(0);
  EXPECT_EQ(header_->lanes[5].hits.load(), 11u);
}

TEST_F(StatsLanesTest, ALaneOfALiveProcessIsNotTaken) {
  header_->lanes[5].owner.store(static_cast<uint64_t>(getppid()));
  StatsLanes lanes(header_, 5, true);
  lanes.CountHit(0);
  EXPECT_EQ(header_->lanes[5].owner.load(), static_cast<uint64_t>(getppid()));
  EXPECT_EQ(header_->lanes[5].hits.load(), 0u);
  EXPECT_EQ(header_->stats[5].hits.load(), 1u);
}

TEST_F(StatsLanesTest, AForkedChildCountsInALaneOfItsOwn) {
  StatsLanes lanes(header_, 3, true);
  lanes.CountHit(0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    lanes.CountHit(0);
    lanes.CountHit(0);
    // Not the parent's lane; a lane (or the slot) the child picked.
    bool ok = header_->lanes[3].hits.load() == 1 &&
              header_->lanes[3].owner.load() == static_cast<uint64_t>(getppid());
    lanes.Release();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(header_->lanes[3].owner.load(), Me()) << "the parent keeps its lane";
  EXPECT_EQ(Read().hits, 3u);
  for (const layout::StatsLane& l : header_->lanes) {
    EXPECT_NE(l.owner.load(), static_cast<uint64_t>(child)) << "released by the child";
  }
  lanes.CountHit(0);
  EXPECT_EQ(header_->lanes[3].hits.load(), 2u);
}

TEST_F(StatsLanesTest, ReleaseGivesTheLaneBackAndLaterCountsGoToTheSlot) {
  StatsLanes lanes(header_, 3, true);
  lanes.CountHit(0);
  lanes.Release();
  EXPECT_EQ(header_->lanes[3].owner.load(), 0u);
  EXPECT_EQ(header_->lanes[3].hits.load(), 1u) << "its counts stay";
  lanes.CountHit(0);
  EXPECT_EQ(header_->stats[3].hits.load(), 1u);
  StatsLanes next(header_, 3, true);
  EXPECT_EQ(header_->lanes[3].owner.load(), Me());
}

TEST_F(StatsLanesTest, OnSeveralNodesAHitFromTheReadersNodeIsANumaHit) {
  StatsLanes lanes(header_, 3, /*single_node=*/false);
  lanes.CountHit(0);          // this host's one node: the reader's
  lanes.CountRead(true, -1);  // a row from disk
  const CacheStats st = Read(/*single_node=*/false);
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.numa_hits, 1u);
}

TEST_F(StatsLanesTest, PutsAndSpillReadsAreCounted) {
  StatsLanes lanes(header_, 3, true);
  lanes.CountPuts(3, 300);
  lanes.CountPuts(1, 100);
  lanes.CountPutsFull(2);
  lanes.CountSpillReads(4);
  lanes.CountSpillReads(0);
  const CacheStats st = Read();
  EXPECT_EQ(st.mem_rows, 4u);
  EXPECT_EQ(st.mem_bytes, 400u);
  EXPECT_EQ(st.puts_full, 2u);
  EXPECT_EQ(st.spill_reads, 4u);
}

}  // namespace
}  // namespace shmcache
