// Memory of destroyed sessions that processes still map (HeldMemory): what
// a scan of the mappings (mapped_files_test.cc) found unmapped is released,
// and scans slow down while readers hold on.
#include "daemon/held_memory.h"

#include <chrono>
#include <vector>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

using Clock = HeldMemory::Clock;

TEST(HeldMemoryTest, SettleReleasesOnlyWhatTheScanLookedForAndFoundUnmapped) {
  MemoryAccount account{.cap = 100, .used = 60};
  HeldMemory held;
  const FileId a{1, 10}, b{1, 11}, c{1, 12};
  Clock::time_point t0 = Clock::now();
  held.Add(7, {{a, 10}, {b, 20}}, t0);
  EXPECT_TRUE(held.ScanDue(t0));
  EXPECT_EQ(held.bytes(), 30u);
  std::vector<FileId> wanted = held.Wanted();
  held.Add(8, {{c, 30}}, t0);  // destroyed while the scan ran
  EXPECT_EQ(held.Settle(wanted, MappedScan{{b}, {}}, t0, &account, nullptr), 10u);
  EXPECT_EQ(held.bytes(), 50u);
  EXPECT_EQ(account.used, 50u);
  EXPECT_FALSE(held.ScanDue(t0));
  EXPECT_TRUE(held.ScanDue(t0 + HeldMemory::kFirstScanInterval));
  EXPECT_EQ(held.Settle(held.Wanted(), MappedScan{}, t0, &account, nullptr), 50u);
  EXPECT_TRUE(held.empty());
  EXPECT_EQ(account.used, 0u);
  EXPECT_FALSE(held.ScanDue(t0 + HeldMemory::kMaxScanInterval));
}

TEST(HeldMemoryTest, ScansSlowDownWhileReadersHoldOn) {
  MemoryAccount account{.cap = 100, .used = 10};
  HeldMemory held;
  const FileId a{1, 10};
  Clock::time_point t = Clock::now();
  held.Add(7, {{a, 10}}, t);
  Clock::duration last{};
  for (int i = 0; i < 10; ++i) {
    held.Settle(held.Wanted(), MappedScan{{a}, {}}, t, &account, nullptr);
    Clock::duration wait{};
    while (!held.ScanDue(t + wait)) wait += std::chrono::milliseconds(10);
    EXPECT_GE(wait, last);
    EXPECT_LE(wait, HeldMemory::kMaxScanInterval);
    last = wait;
  }
  EXPECT_EQ(last, HeldMemory::kMaxScanInterval);
  EXPECT_EQ(account.used, 10u);
}

}  // namespace
}  // namespace shmcache
