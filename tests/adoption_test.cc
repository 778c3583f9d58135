// Adoption of what an earlier daemon left in shared memory (adoption.cc,
// and CacheState::Adopt for each cache): what it cannot trust is refused,
// what it can is handed over with its session. (A restarted daemon end to
// end: restart_test.cc, reliability/planted_files_test.cc.)
#include "daemon/adoption.h"

#include <atomic>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/cache_spiller.h"
#include "daemon/cache_state.h"
#include "daemon/logger.h"
#include "tests/support/cache_state_fixture.h"

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

// An Adoption over the fixture's shm dir, without a spill store; the
// notes it makes are kept in notes_.
class AdoptionTest : public CacheStateTest {
 protected:
  bool Run(bool stop, Adopted* out) {
    CacheSpiller spiller(paths_, &log_);
    auto note = [this](const std::string& text) { notes_.push_back(text); };
    EXPECT_TRUE(spiller.Open("", note).ok());
    Adoption adoption(paths_, 1, /*watch_pid=*/0, &spiller, &log_, note);
    std::atomic<bool> stop_requested{stop};
    return adoption.Run(&stop_requested, &fresh_, out);
  }
  bool Exists(const std::string& path) { return std::ifstream(path).good(); }

  Logger log_;  // not opened: lines go nowhere
  MemoryAccount fresh_{256 * kMB, 0};
  std::vector<std::string> notes_;
};

TEST_F(AdoptionTest, HandsOverACacheWithItsSessionAndRemovesStrays) {
  Create(64 * kMB);
  ChunkLease a;
  ASSERT_TRUE(Lease(1, 0, 1000, &a).ok());
  const std::string stray = paths_.shm_prefix + "junk";
  { std::ofstream(stray) << "x"; }
  Adopted out;
  ASSERT_TRUE(Run(false, &out));
  ASSERT_EQ(out.caches.count(kCacheId), 1u);
  const CacheState& c = *out.caches.at(kCacheId);
  EXPECT_EQ(c.session_id(), 77u);
  EXPECT_EQ(c.name(), "train");
  EXPECT_EQ(c.fingerprint(), "fp-1");
  EXPECT_EQ(out.sessions.at(77), std::vector<uint32_t>{kCacheId});
  EXPECT_EQ(fresh_.used, cache_->reserved_bytes()) << "its memory is reserved";
  EXPECT_FALSE(Exists(stray)) << "not a file this server writes";
  EXPECT_TRUE(notes_.empty()) << testing::PrintToString(notes_);
}

TEST_F(AdoptionTest, DiscardsACacheWithoutItsHeader) {
  ShmFile seg;
  ASSERT_TRUE(
      SegmentAllocator::CreateSegmentFile(paths_, 9, 0, 0, layout::kMinSegmentBytes, &seg)
          .ok());
  seg.Unmap();
  Adopted out;
  ASSERT_TRUE(Run(false, &out));
  EXPECT_TRUE(out.caches.empty());
  EXPECT_FALSE(Exists(paths_.SegmentFile(9, 0)));
  ASSERT_EQ(notes_.size(), 1u);
  EXPECT_EQ(notes_[0],
            "cache 9 left by the earlier server was discarded: its header file is "
            "missing");
  EXPECT_EQ(fresh_.used, 0u);
}

TEST_F(AdoptionTest, AStopRequestLeavesWhatIsNotAdoptedYet) {
  Create(64 * kMB);
  Adopted out;
  EXPECT_FALSE(Run(true, &out));
  EXPECT_TRUE(out.caches.empty());
  EXPECT_TRUE(Exists(paths_.CacheFile(kCacheId))) << "kept for the next start";
  EXPECT_EQ(fresh_.used, 0u);
}

}  // namespace
}  // namespace shmcache
