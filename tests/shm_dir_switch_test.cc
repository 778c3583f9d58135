// MoveEarlierShmFiles (daemon/shm_dir_switch.h): the files a killed server
// of the other huge-page mode left move whole into this server's shm dir,
// a move cut short goes on, and nothing is touched that is not the
// instance's. The huge dir here is a plain 0700 directory (what a mount
// point is before the mount), so no root is needed; mounting and the
// warning of --start are tested end to end in
// tests/python/test_huge_mode_switch.py.
#include "daemon/shm_dir_switch.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/instance_lock.h"
#include "daemon/logger.h"
#include "format/instance.h"
#include "format/layout.h"

namespace shmcache {
namespace {

constexpr uint32_t kCache = 7;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

void Write(const std::string& path, const std::string& bytes) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << path;
  fchmod(fd, 0600);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
}

class ShmDirSwitchTest : public ::testing::Test {
 protected:
  // A port of this user that no server holds and no file names: the host
  // lock keeps any server off it while the test plants and moves files.
  void SetUp() override {
    for (int p = 40000 + static_cast<int>(getpid() % 20000); p < 65536; ++p) {
      port_ = p;
      huge_ = HugeShmDir(port_);
      if (Exists(huge_) || AnyPlanted("/dev/shm")) continue;
      if (TakeHostLock(HostLockPath(port_), port_, "/tmp", &lock_fd_).ok()) return;
    }
    FAIL() << "no free port";
  }
  void TearDown() override {
    Clean();
    if (lock_fd_ >= 0) {
      ReleaseLockFile(HostLockPath(port_), lock_fd_);
      close(lock_fd_);
    }
  }

  bool AnyPlanted(const std::string& dir) const {
    for (const std::string& name : Names()) {
      if (Exists(dir + "/" + name)) return true;
    }
    return false;
  }

  void Clean() {
    for (const std::string& dir : {std::string("/dev/shm"), huge_}) {
      for (const std::string& name : Names()) unlink((dir + "/" + name).c_str());
      unlink(Paths(dir).shm_prefix.append("moving").c_str());
    }
    rmdir(huge_.c_str());
  }

  InstancePaths Paths(const std::string& dir) const {
    return MakeInstancePaths(port_, "", dir);
  }

  // The instance's file names (relative): a header, a table, two segments
  // and the sessions list.
  std::vector<std::string> Names() const {
    InstancePaths p = Paths("/x");
    std::vector<std::string> names = {
        p.CacheFile(kCache), p.TableFile(kCache, 0, 0xabcdef01), p.SegmentFile(kCache, 0),
        p.SegmentFile(kCache, 1), p.SessionsFile()};
    for (std::string& n : names) n = n.substr(3);
    return names;
  }

  // Distinct bytes per file; a segment is larger than its header.
  static std::string Bytes(size_t i) {
    std::string b(8192 + i * 4096, '\0');
    for (size_t k = 4096; k < b.size(); ++k) b[k] = static_cast<char>('a' + (k + i) % 26);
    return b;
  }

  void Plant(const std::string& dir) {
    std::vector<std::string> names = Names();
    for (size_t i = 0; i < names.size(); ++i) Write(dir + "/" + names[i], Bytes(i));
  }

  void ExpectAllIn(const std::string& dir, const std::string& not_in) {
    std::vector<std::string> names = Names();
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(Read(dir + "/" + names[i]), Bytes(i)) << names[i];
      EXPECT_FALSE(Exists(not_in + "/" + names[i])) << names[i];
    }
  }

  int port_ = 0;
  int lock_fd_ = -1;
  std::string huge_;
  Logger log_;
};

TEST_F(ShmDirSwitchTest, HugeDirFilesMoveWholeToDevShmAndTheDirGoes) {
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant(huge_);
  ShmDirSwitch r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  EXPECT_EQ(r.caches, 1);
  EXPECT_EQ(r.not_moved, 0);
  ExpectAllIn("/dev/shm", huge_);
  EXPECT_FALSE(Exists(huge_));
  EXPECT_NE(r.warning.find(fmt::format("left 1 cache(s) in {}", huge_)),
            std::string::npos)
      << r.warning;
  EXPECT_NE(r.warning.find("It ran with SHMCACHE_HUGE_TMPFS, this server without"),
            std::string::npos)
      << r.warning;
}

TEST_F(ShmDirSwitchTest, DevShmFilesMoveIntoTheHugeDir) {
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant("/dev/shm");
  ShmDirSwitch r = MoveEarlierShmFiles(port_, huge_, true, "", nullptr, &log_);
  EXPECT_EQ(r.caches, 1);
  ExpectAllIn(huge_, "/dev/shm");
  EXPECT_NE(r.warning.find("It ran without SHMCACHE_HUGE_TMPFS"), std::string::npos)
      << r.warning;
}

TEST_F(ShmDirSwitchTest, AMoveCutShortGoesOn) {
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant(huge_);
  // Killed after copying the header and a table into place (a copy being
  // made has no name: it went with the process).
  std::vector<std::string> names = Names();
  Write("/dev/shm/" + names[0], Bytes(0));
  Write("/dev/shm/" + names[1], Bytes(1));
  ShmDirSwitch r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  EXPECT_EQ(r.caches, 1);
  ExpectAllIn("/dev/shm", huge_);
  EXPECT_FALSE(Exists(huge_));
}

// Issue 32, item 6: the move once copied every file through one fixed name,
// <prefix>moving in /dev/shm; a directory another user made there failed
// every copy, and each cache was then removed from both places. Copies have
// no name now: nothing planted anywhere stops them.
TEST_F(ShmDirSwitchTest, APlantedDirectoryAtTheOldTemporaryNameStopsNothing) {
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant(huge_);
  const std::string planted = Paths("/dev/shm").shm_prefix + "moving";
  ASSERT_EQ(mkdir(planted.c_str(), 0777), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(planted.c_str(), 65534, 65534), 0);
  }
  ShmDirSwitch r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  struct stat st {};
  EXPECT_EQ(lstat(planted.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  rmdir(planted.c_str());
  EXPECT_EQ(r.caches, 1) << r.warning;
  EXPECT_EQ(r.not_moved, 0);
  ExpectAllIn("/dev/shm", huge_);
  EXPECT_FALSE(Exists(huge_));
}

// A copy that cannot be made (here a name in /dev/shm that something not
// ours holds; no room does the same) never costs the earlier files: they
// are the only whole copy, and stay, the huge dir with them; the copies
// made are removed, and the warning says where the cache is.
TEST_F(ShmDirSwitchTest, AFailedMoveKeepsTheOnlyCopy) {
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant(huge_);
  std::vector<std::string> names = Names();
  const std::string taken = "/dev/shm/" + names[3];  // the second segment's name
  ASSERT_EQ(mkdir(taken.c_str(), 0777), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(taken.c_str(), 65534, 65534), 0);
  }
  ShmDirSwitch r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  rmdir(taken.c_str());
  EXPECT_EQ(r.caches, 0);
  EXPECT_EQ(r.not_moved, 1);
  for (size_t i = 0; i < names.size(); ++i) {
    // The cache's files whole where they were; the sessions list moved.
    if (i + 1 < names.size()) {
      EXPECT_EQ(Read(huge_ + "/" + names[i]), Bytes(i)) << names[i];
      EXPECT_FALSE(Exists("/dev/shm/" + names[i])) << names[i];
    } else {
      EXPECT_EQ(Read("/dev/shm/" + names[i]), Bytes(i)) << names[i];
    }
  }
  EXPECT_NE(r.warning.find(fmt::format("left 1 that could not be moved to /dev/shm")),
            std::string::npos)
      << r.warning;
  EXPECT_NE(r.warning.find(taken + " exists"), std::string::npos) << r.warning;
  // A later start that can copy it moves it whole.
  r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  EXPECT_EQ(r.caches, 1) << r.warning;
  ExpectAllIn("/dev/shm", huge_);
  EXPECT_FALSE(Exists(huge_));
}

// A sparse segment as the allocator leaves it (segment_allocator.h): `size`
// bytes, its header saying `carved`, rows below the carve mark and pages
// supplied up to `supplied`, a hole past that.
void PlantSegment(const std::string& path, uint32_t seg_no, uint64_t size,
                  uint64_t carved, uint64_t supplied) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << path;
  fchmod(fd, 0600);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  ASSERT_EQ(posix_fallocate(fd, 0, static_cast<off_t>(supplied)), 0);
  std::string bytes(carved, '\0');
  for (size_t k = layout::kSegmentHeaderSize; k < bytes.size(); ++k) {
    bytes[k] = static_cast<char>('a' + k % 26);
  }
  layout::SegmentHeader h{};
  h.file.magic = layout::kSegmentMagic;
  h.file.version = layout::kLayoutVersion;
  h.file.header_size = sizeof(layout::SegmentHeader);
  h.file.file_size = size;
  h.seg_id = seg_no;
  h.cache_id = kCache;
  h.carved.store(carved);
  std::memcpy(bytes.data(), &h, sizeof(h));
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), 0),
            static_cast<ssize_t>(bytes.size()));
  close(fd);
}

uint64_t AllocatedBytes(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// The move copied whole files: a segment's supply ahead and its holes came
// out allocated, up to the segment's size (64 MB here for 5 MB of rows).
// Now only the carved part is copied, in whole 2 MB pages; the rest stays a
// hole, which adoption counts as not supplied. The rows below the carve
// mark come over byte for byte.
TEST_F(ShmDirSwitchTest, SegmentsMoveWithTheirCarvedPartOnlyTheRestLeftAHole) {
  constexpr uint64_t kMB = 1u << 20;
  constexpr uint64_t kSize = 64 * kMB, kCarved = 5 * kMB + 4096;
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant("/dev/shm");
  std::vector<std::string> names = Names();
  // Segment 0 carved to 5 MB with 24 MB supplied ahead of that; segment 1
  // made ahead of need (carved to its header) with its first 18 MB.
  PlantSegment("/dev/shm/" + names[2], 0, kSize, kCarved, kCarved + 24 * kMB);
  PlantSegment("/dev/shm/" + names[3], 1, kSize, layout::kSegmentHeaderSize, 18 * kMB);
  const std::string rows = Read("/dev/shm/" + names[2]).substr(0, kCarved);
  ASSERT_GE(AllocatedBytes("/dev/shm/" + names[2]), kCarved + 24 * kMB);

  ShmDirSwitch r = MoveEarlierShmFiles(port_, huge_, true, "", nullptr, &log_);
  EXPECT_EQ(r.caches, 1) << r.warning;
  EXPECT_FALSE(Exists("/dev/shm/" + names[2]));
  const std::string seg0 = huge_ + "/" + names[2], seg1 = huge_ + "/" + names[3];
  const std::string moved = Read(seg0);
  ASSERT_EQ(moved.size(), kSize);
  EXPECT_EQ(Read(seg1).size(), kSize);
  EXPECT_TRUE(moved.compare(0, kCarved, rows) == 0);
  EXPECT_EQ(moved.find_first_not_of('\0', kCarved), std::string::npos);
  // Reading the holes above allocated nothing.
  EXPECT_LE(AllocatedBytes(seg0), 6 * kMB) << "carved " << kCarved;
  EXPECT_GE(AllocatedBytes(seg0), kCarved);
  EXPECT_LE(AllocatedBytes(seg1), 2 * kMB);
  EXPECT_LT(r.bytes, 9 * kMB) << "what the move copied: the carved parts and the rest";
}

// A segment copied sparse still needs its full size in the new place:
// adoption reserves it so under a cap that place's room bounds, and the
// supply allocates its holes there. A cache whose files at their sizes do
// not fit stays whole where it was, as when a whole copy found no room
// (moved for its carved part alone, it would be over the new cap, and
// adoption would discard it). Mounting the small tmpfs needs root.
TEST_F(ShmDirSwitchTest, ACacheWhoseSegmentsDoNotFitAtTheirSizesStaysWhereItWas) {
  constexpr uint64_t kMB = 1u << 20;
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  if (mount("tmpfs", huge_.c_str(), "tmpfs", 0, "size=32m,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a 32 MB tmpfs (needs root): " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { umount2(dir.c_str(), MNT_DETACH); }
  } unmount{huge_};
  Plant("/dev/shm");
  std::vector<std::string> names = Names();
  // 5 MB carved (it would fit), 64 MB in all (it does not).
  PlantSegment("/dev/shm/" + names[2], 0, 64 * kMB, 5 * kMB, 8 * kMB);
  ShmDirSwitch r = MoveEarlierShmFiles(port_, huge_, true, "", nullptr, &log_);
  EXPECT_EQ(r.caches, 0) << r.warning;
  EXPECT_EQ(r.not_moved, 1) << r.warning;
  EXPECT_NE(r.warning.find("no room in " + huge_), std::string::npos) << r.warning;
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    EXPECT_TRUE(Exists("/dev/shm/" + names[i])) << names[i];
    EXPECT_FALSE(Exists(huge_ + "/" + names[i])) << names[i];
  }
}

TEST_F(ShmDirSwitchTest, AStopRequestLeavesTheRestForTheNextStart) {
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant(huge_);
  std::atomic<bool> stop{true};
  ShmDirSwitch r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", &stop, &log_);
  EXPECT_EQ(r.caches, 0);
  EXPECT_TRUE(Exists(huge_ + "/" + Names()[2]));
  EXPECT_NE(r.warning.find("the next start moves it"), std::string::npos) << r.warning;
  r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  EXPECT_EQ(r.caches, 1);
  ExpectAllIn("/dev/shm", huge_);
}

TEST_F(ShmDirSwitchTest, NothingOfAnEarlierServerSaysNothing) {
  ShmDirSwitch r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  EXPECT_EQ(r.warning, "");
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  r = MoveEarlierShmFiles(port_, huge_, true, "", nullptr, &log_);
  EXPECT_EQ(r.warning, "");
  // An empty huge dir left by a start that failed is removed quietly.
  r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  EXPECT_EQ(r.warning, "");
  EXPECT_FALSE(Exists(huge_));
}

TEST_F(ShmDirSwitchTest, AHugeDirOpenToOthersIsNotTouched) {
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant(huge_);
  ASSERT_EQ(chmod(huge_.c_str(), 0755), 0);
  ShmDirSwitch r = MoveEarlierShmFiles(port_, "/dev/shm", false, "", nullptr, &log_);
  EXPECT_EQ(r.warning, "");
  EXPECT_TRUE(Exists(huge_ + "/" + Names()[0]));
  EXPECT_FALSE(Exists("/dev/shm/" + Names()[0]));
}

TEST_F(ShmDirSwitchTest, AnotherShmDirIsNotTouched) {
  ASSERT_EQ(mkdir(huge_.c_str(), 0700), 0);
  Plant(huge_);
  ShmDirSwitch r = MoveEarlierShmFiles(port_, "/tmp", false, "", nullptr, &log_);
  EXPECT_EQ(r.warning, "");
  EXPECT_TRUE(Exists(huge_ + "/" + Names()[0]));
}

}  // namespace
}  // namespace shmcache
