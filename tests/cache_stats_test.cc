// ReadCacheStats: the one reading of a cache header that Cache::GetStats
// and the daemon's listings share.
#include "format/cache_stats.h"

#include <cstring>
#include <memory>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

std::unique_ptr<layout::CacheHeader> NewHeader() {
  auto h = std::make_unique<layout::CacheHeader>();
  h->cache_id = 3;
  h->session_id = 11;
  h->budget_bytes = 8u << 20;
  h->reserved_bytes.store(5u << 20);
  h->name_len = 5;
  std::memcpy(h->name, "train", 5);
  return h;
}

TEST(CacheStatsTest, CountersAreSummedOverEverySlot) {
  auto h = NewHeader();
  for (size_t i = 0; i < layout::kStatsSlots; i += 9) {  // slots 0, 9, ..., 63
    layout::StatsSlot& s = h->stats[i];
    s.hits.store(1);
    s.misses.store(2);
    s.numa_hits.store(1);
    s.rows.store(3);
    s.bytes.store(300);
    s.disk_rows.store(4);
    s.disk_bytes.store(400);
    s.puts_full.store(5);
  }
  const uint64_t slots = (layout::kStatsSlots + 8) / 9;
  CacheStats st = ReadCacheStats(*h, /*single_node=*/false);
  EXPECT_EQ(st.cache_id, 3u);
  EXPECT_EQ(st.session_id, 11u);
  EXPECT_EQ(st.name, "train");
  EXPECT_EQ(st.budget_bytes, 8u << 20);
  EXPECT_EQ(st.reserved_bytes, 5u << 20);
  EXPECT_EQ(st.hits, slots);
  EXPECT_EQ(st.misses, 2 * slots);
  EXPECT_EQ(st.numa_hits, slots);
  EXPECT_EQ(st.mem_rows, 3 * slots);
  EXPECT_EQ(st.mem_bytes, 300 * slots);
  EXPECT_EQ(st.disk_rows, 4 * slots);
  EXPECT_EQ(st.disk_bytes, 400 * slots);
  EXPECT_EQ(st.puts_full, 5 * slots);
  EXPECT_EQ(st.spill_reads, 0u) << "slots hold none; lanes and the daemon do";
}

TEST(CacheStatsTest, ReadsCountedInLanesAreAddedToTheSlots) {
  auto h = NewHeader();
  h->stats[5].hits.store(7);
  h->stats[5].misses.store(1);
  h->lanes[5].owner.store(1234);
  h->lanes[5].hits.store(100);
  h->lanes[5].misses.store(10);
  h->lanes[5].numa_hits.store(60);
  h->lanes[5].spill_reads.store(40);
  h->lanes[63].hits.store(3);  // a lane whose owner is gone keeps its counts
  h->lanes[63].spill_reads.store(2);
  CacheStats st = ReadCacheStats(*h, /*single_node=*/false);
  EXPECT_EQ(st.spill_reads, 42u);
  EXPECT_EQ(st.hits, 110u);
  EXPECT_EQ(st.misses, 11u);
  EXPECT_EQ(st.numa_hits, 60u);
  EXPECT_EQ(ReadCacheStats(*h, true).numa_hits, 110u);
}

TEST(CacheStatsTest, OnOneNodeEveryHitIsANumaHit) {
  auto h = NewHeader();
  h->stats[0].hits.store(10);
  h->stats[0].numa_hits.store(0);  // readers do not count them there
  EXPECT_EQ(ReadCacheStats(*h, true).numa_hits, 10u);
  EXPECT_EQ(ReadCacheStats(*h, false).numa_hits, 0u);
}

// Every combination of the state bits reads as exactly one of: takes rows
// (in memory), spills now, full.
TEST(CacheStatsTest, EveryStateIsFullOrSpillingOrNeither) {
  using namespace layout;
  struct Case {
    uint32_t state;
    bool full, spills_now, spilling_on;
  };
  const Case cases[] = {
      {0, false, false, false},
      {kStateSpillEnabled, false, false, true},
      {kStateSpillEnabled | kStateMemFull, false, true, true},
      {kStateMemFull, true, false, false},  // memory used up, no spilling
      {kStateFull, true, false, false},
      {kStateFull | kStateSpillEnabled, true, false, false},
      {kStateFull | kStateMemFull, true, false, false},
      // Marked full after it spilled (its index reached its largest size):
      // rows go nowhere.
      {kStateFull | kStateSpillEnabled | kStateMemFull, true, false, false},
  };
  auto h = NewHeader();
  for (const Case& c : cases) {
    for (uint32_t destroyed : {0u, kStateDestroyed}) {
      const uint32_t state = c.state | destroyed;
      SCOPED_TRACE(state);
      h->state.store(state);
      CacheStats st = ReadCacheStats(*h, true);
      EXPECT_EQ(st.full, c.full);
      EXPECT_EQ(st.spills_now, c.spills_now);
      EXPECT_EQ(IsFull(state), c.full);
      EXPECT_EQ(SpillsNow(state), c.spills_now);
      EXPECT_EQ(SpillingOn(state), c.spilling_on);
      EXPECT_FALSE(st.full && st.spills_now);
    }
  }
}

}  // namespace
}  // namespace shmcache
