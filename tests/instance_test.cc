// An instance's file names (instance.h): ParseShmName reads back exactly
// the names InstancePaths writes, and nothing else.
#include "format/instance.h"

#include <string>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

TEST(ShmNameTest, ReadsBackExactlyTheNamesPathsWrite) {
  InstancePaths p = MakeInstancePaths(40002, "/tmp/r", "/dev/shm");
  auto rest = [&](const std::string& path) { return path.substr(p.shm_prefix.size()); };
  ShmName n = ParseShmName(rest(p.CacheFile(4000000000u)));
  EXPECT_EQ(n.kind, ShmName::Kind::kCache);
  EXPECT_EQ(n.cache_id, 4000000000u);
  n = ParseShmName(rest(p.TableFile(7, 3, 0xdeadbeef)));
  EXPECT_EQ(n.kind, ShmName::Kind::kTable);
  EXPECT_EQ(n.cache_id, 7u);
  EXPECT_EQ(n.number, 3u);
  EXPECT_EQ(n.tag, 0xdeadbeefu);
  n = ParseShmName(rest(p.SegmentFile(7, 12)));
  EXPECT_EQ(n.kind, ShmName::Kind::kSegment);
  EXPECT_EQ(n.number, 12u);
  EXPECT_EQ(ParseShmName(rest(p.SessionsFile())).kind, ShmName::Kind::kSessions);
  n = ParseShmName(rest(p.StageFile(9, 0x0a0b0c0d)));
  EXPECT_EQ(n.kind, ShmName::Kind::kStage);
  EXPECT_EQ(n.cache_id, 9u);
  EXPECT_EQ(n.tag, 0x0a0b0c0du);
  for (const char* other :
       {"seg.1.01", "seg.1.4294967296", "seg.1.99999999999", "seg.1", "seg.1.2.3",
        "cache.1x", "cache.", "table.1.0", "table.1.0.DEADBEEF", "table.1.0.123",
        "sessions.tmp.1", "stage.1", "stage.1.0a0b0c0", "stage.1.2.0a0b0c0d"}) {
    EXPECT_EQ(ParseShmName(other).kind, ShmName::Kind::kOther) << other;
  }
}

}  // namespace
}  // namespace shmcache
