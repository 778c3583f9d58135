// Adoption of a cache an earlier daemon left in shared memory
// (cache_state_adoption.cc): what it cannot trust is refused. (A restarted
// daemon end to end: restart_test.cc, reliability/planted_files_test.cc.)
#include "cache_state.h"

#include <gtest/gtest.h>

#include "cache_state_fixture.h"

namespace shmcache {
namespace {

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

}  // namespace
}  // namespace shmcache
