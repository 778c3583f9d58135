// CacheShareBytesAt (format/cache_share.h) over planted sysfs cache trees,
// and StreamsRows (format/row_copy.h): which copies stream, by the bytes a
// call writes against the CPU's cache share.
#include "format/cache_share.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "format/row_copy.h"
#include "tests/support/files.h"

namespace shmcache {
namespace {

// One cache entry, as the kernel lists it under cpu<N>/cache/index<i>/.
void Plant(const std::string& dir, int index, const std::string& level,
           const std::string& type, const std::string& size, const std::string& cpus) {
  const std::string d = dir + "/index" + std::to_string(index);
  ASSERT_EQ(mkdir(d.c_str(), 0700), 0) << d;
  std::ofstream(d + "/level") << level << "\n";
  std::ofstream(d + "/type") << type << "\n";
  std::ofstream(d + "/size") << size << "\n";
  std::ofstream(d + "/shared_cpu_list") << cpus << "\n";
}

TEST(CacheShareTest, TheLastLevelOverTheCpusSharingIt) {
  // The project's VM: a 32 MB L3 shared by its 2 CPUs.
  test::TempDir dir;
  Plant(dir.path(), 0, "1", "Data", "48K", "0");
  Plant(dir.path(), 1, "1", "Instruction", "32K", "0");
  Plant(dir.path(), 2, "2", "Unified", "1024K", "0");
  Plant(dir.path(), 3, "3", "Unified", "32768K", "0-1");
  EXPECT_EQ(CacheShareBytesAt(dir.path()), size_t{16} << 20);
}

TEST(CacheShareTest, CpuListsWithRangesAndSingles) {
  test::TempDir dir;
  Plant(dir.path(), 0, "2", "Unified", "2M", "0");
  Plant(dir.path(), 1, "3", "Unified", "36M", "0-3,8-11,16");  // 9 CPUs
  EXPECT_EQ(CacheShareBytesAt(dir.path()), size_t{4} << 20);
}

TEST(CacheShareTest, AMalformedLastLevelFallsBackToTheLevelBelow) {
  test::TempDir dir;
  Plant(dir.path(), 0, "2", "Unified", "1024K", "0");
  Plant(dir.path(), 1, "3", "Unified", "32768X", "0-1");  // unknown unit
  EXPECT_EQ(CacheShareBytesAt(dir.path()), size_t{1} << 20);
}

TEST(CacheShareTest, NothingReadableIsZero) {
  test::TempDir dir;
  EXPECT_EQ(CacheShareBytesAt(dir.path()), 0u);
  EXPECT_EQ(CacheShareBytesAt(dir.path() + "/absent"), 0u);
  Plant(dir.path(), 0, "3", "Unified", "32768K", "1-0");  // a reversed range
  EXPECT_EQ(CacheShareBytesAt(dir.path()), 0u);
}

TEST(CacheShareTest, ThisMachinesShareIsPositive) { EXPECT_GT(CacheShareBytes(), 0u); }

TEST(StreamsRowsTest, OnlyLargeRowsWhoseCallOutgrowsTheShare) {
  constexpr size_t kShare = size_t{16} << 20;
  constexpr size_t kKB = 1024;
  // A single Get into the caller's Row: one destination, which stays
  // cached, so memcpy (these streamed before).
  EXPECT_FALSE(StreamsRows(150 * kKB, 1, kShare));
  EXPECT_FALSE(StreamsRows(600 * kKB, 1, kShare));
  EXPECT_FALSE(StreamsRows(size_t{1} << 20, 1, kShare));
  // A batch of 64 whose rows fit the share (9.6 MB): memcpy too.
  EXPECT_FALSE(StreamsRows(150 * kKB, 64, kShare));
  // A batch of 64 that does not (38 MB, 64 MB): streamed.
  EXPECT_TRUE(StreamsRows(600 * kKB, 64, kShare));
  EXPECT_TRUE(StreamsRows(size_t{1} << 20, 64, kShare));
  // A single row larger than the share.
  EXPECT_TRUE(StreamsRows(size_t{32} << 20, 1, kShare));
  // Small rows never, however many (streaming loses at 64 KB and below).
  EXPECT_FALSE(StreamsRows(64 * kKB, 4096, kShare));
  EXPECT_FALSE(StreamsRows(kStreamCopyBytes - 8, size_t{1} << 40, kShare));
  // No overflow for a huge count.
  EXPECT_TRUE(StreamsRows(kStreamCopyBytes, ~size_t{0}, kShare));
  // A share of 0 (none known) streams every large row.
  EXPECT_TRUE(StreamsRows(kStreamCopyBytes, 1, 0));
}

}  // namespace
}  // namespace shmcache
