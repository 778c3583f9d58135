// CacheStateTest: the fixture of the suites over one cache (cache_state_test.cc,
// cache_state_<concept>_test.cc, segment_allocator_test.cc, adoption_test.cc,
// cache_spiller_test.cc):
// one cache, id 5, of session 77 in a fresh shm dir, under a 256 MB cap,
// with no daemon. TearDown destroys it and checks that every byte and file
// was given back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/cache_state.h"
#include "tests/support/test_server.h"

namespace shmcache {

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

  void Create(uint64_t budget, int nodes = 1, bool spill_requested = false) {
    Status s =
        CacheState::Create(paths_, kCacheId, /*session_id=*/77, "train", "fp-1", budget,
                           spill_requested, nodes, &account_, /*log=*/nullptr, &cache_);
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
  // A lease for a row of `need` bytes, which is then counted in the cache's
  // stats as a writer counts the rows it wrote before its next lease (the
  // allocator weighs a row it has no room for against them).
  Status Lease(uint64_t conn, int node, uint64_t need, ChunkLease* out) {
    Status s = cache_->Lease(conn, node, need, &account_, out);
    if (s.ok()) {
      if (header_map_.data() == nullptr) {
        EXPECT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header_map_).ok());
      }
      auto* header = reinterpret_cast<layout::CacheHeader*>(header_map_.data());
      header->stats[0].rows.fetch_add(1);
      header->stats[0].bytes.fetch_add(need);
    }
    return s;
  }
  // Leases for rows of `need` bytes until one is refused; its answer.
  Status LeaseUntilRefused(uint64_t need) {
    Status s;
    for (int n = 0; n < 1000 && s.ok(); ++n) {
      ChunkLease l;
      s = Lease(1, 0, need, &l);
    }
    return s;
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
  ShmFile header_map_;  // the cache's header, where Lease counts rows
};

}  // namespace shmcache
