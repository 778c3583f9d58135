// The start-up log's account of the pages behind the shm dir:
// huge only where the mount or the global setting gives tmpfs huge pages.
#include "daemon/shm_pages.h"

#include <gtest/gtest.h>

namespace shmcache {
namespace {

constexpr const char* kMounts =
    "proc /proc proc rw,nosuid 0 0\n"
    "/dev/vda1 / ext4 rw,relatime 0 0\n"
    "tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n"
    "big /mnt/shm tmpfs rw,size=65536m,huge=within_size,mode=700 0 0\n"
    "adv /mnt/shm/adv tmpfs rw,huge=advise 0 0\n";
constexpr const char* kNever = "always within_size advise [never] deny force\n";

TEST(ShmPagesTest, PlainDevShmHasSmallPagesAndTheLogSaysHowToGetHugeOnes) {
  ShmPages p = ShmPagesOf("/dev/shm", kMounts, kNever);
  EXPECT_FALSE(p.huge);
  EXPECT_NE(p.why.find("without huge pages"), std::string::npos) << p.why;
  std::string note = ShmPagesNote("/dev/shm", p);
  EXPECT_NE(note.find("4 KB pages"), std::string::npos) << note;
  EXPECT_NE(note.find("huge=within_size"), std::string::npos) << note;
  EXPECT_NE(note.find("--shm_dir"), std::string::npos) << note;
}

TEST(ShmPagesTest, TheLongestMountPointHoldingTheDirDecides) {
  EXPECT_TRUE(ShmPagesOf("/mnt/shm", kMounts, kNever).huge);
  ShmPages p = ShmPagesOf("/mnt/shm/sub/dir", kMounts, kNever);
  EXPECT_TRUE(p.huge);
  EXPECT_EQ(p.why, "tmpfs mounted huge=within_size");
  EXPECT_EQ(ShmPagesOf("/mnt/shm/adv", kMounts, kNever).why, "tmpfs mounted huge=advise");
  // A name that only starts like a mount point is not under it.
  EXPECT_FALSE(ShmPagesOf("/mnt/shmx", kMounts, kNever).huge);
  EXPECT_EQ(ShmPagesOf("/tmp/x", kMounts, kNever).why, "ext4, not tmpfs");
  EXPECT_NE(ShmPagesNote("/mnt/shm", ShmPagesOf("/mnt/shm", kMounts, kNever))
                .find("huge pages (tmpfs mounted huge=within_size)"),
            std::string::npos);
}

TEST(ShmPagesTest, ForceAndDenyOverrideTheMount) {
  EXPECT_TRUE(ShmPagesOf("/dev/shm", kMounts, "always [force]").huge);
  EXPECT_FALSE(ShmPagesOf("/mnt/shm", kMounts, "[deny] force").huge);
  // No setting file (no transparent huge pages at all): the mount decides.
  EXPECT_TRUE(ShmPagesOf("/mnt/shm", kMounts, "").huge);
  EXPECT_EQ(ShmPagesOf("/x", "", "").why, "its mount was not found");
}

// A shm dir on a disk (--shm_dir /data/cache) is no tmpfs, whatever the
// tmpfs huge-page setting says: "force" was taken to mean huge pages there
// too, and nothing told the server that the dir was a disk's.
TEST(ShmPagesTest, ADirOnADiskIsNoTmpfsWhateverTheSetting) {
  for (const char* setting : {kNever, "always [force]", "[deny] force", ""}) {
    ShmPages p = ShmPagesOf("/tmp/x", kMounts, setting);
    EXPECT_FALSE(p.huge) << setting;
    EXPECT_TRUE(p.disk) << setting;
    EXPECT_EQ(p.why, "ext4, not tmpfs") << setting;
  }
  EXPECT_FALSE(ShmPagesOf("/dev/shm", kMounts, kNever).disk);
  EXPECT_FALSE(ShmPagesOf("/dev/shm", kMounts, "always [force]").disk);
  EXPECT_FALSE(ShmPagesOf("/x", "", "").disk) << "a mount not found is no disk's";
  EXPECT_FALSE(ShmPagesOf("/r/x", "none /r ramfs rw 0 0\n", kNever).disk);
}

}  // namespace
}  // namespace shmcache
