// A test killed before its temporary dirs are removed (a meson timeout, a
// crash, SIGKILL) leaves none behind, nor a small tmpfs mounted on one:
// the guard of RemovedIfThisProcessDies (tests/support/files.h) removes
// them once the process is gone. The process killed here is a child that
// made its first temporary paths itself, so that it has a guard of its own
// (the guard of this process waits for this process too): this suite's one
// test, and nothing before the fork makes a temporary path.
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/child_process.h"
#include "tests/support/files.h"
#include "tests/support/tmpfs_mount.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {
namespace {

struct Made {
  char dir[512];    // a TempDir in /dev/shm
  char mount[512];  // a TmpfsMount's mount point ("" where none can be made)
  int ready;
};

bool Mounted(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.find(" " + path + " ") != std::string::npos) return true;
  }
  return false;
}

TEST(TempDirs, AKilledTestLeavesNoTemporaryDirOrMount) {
  Made* made = SharedBlock<Made>();
  const pid_t child = ForkChild([made] {
    TempDir dir("/dev/shm");
    TmpfsMount mount("1m");
    std::snprintf(made->dir, sizeof made->dir, "%s", dir.path().c_str());
    std::snprintf(made->mount, sizeof made->mount, "%s",
                  mount.mounted() ? mount.path().c_str() : "");
    __atomic_store_n(&made->ready, 1, __ATOMIC_RELEASE);
    for (;;) pause();  // until killed
    return 0;
  });
  ASSERT_GT(child, 0);
  ASSERT_TRUE(WaitFor([made] { return __atomic_load_n(&made->ready, __ATOMIC_ACQUIRE); },
                      std::chrono::seconds(60)));
  const std::string dir = made->dir, mount = made->mount;
  ASSERT_TRUE(PathExists(dir));
  KillAndReap(child);
  EXPECT_TRUE(WaitFor([&] { return !PathExists(dir); })) << dir << " left behind";
  if (!mount.empty()) {
    EXPECT_TRUE(WaitFor([&] { return !Mounted(mount) && !PathExists(mount); }))
        << mount << " left " << (Mounted(mount) ? "mounted" : "behind");
  }
  // Whatever the outcome: nothing of the child's left by this test either.
  if (Mounted(mount)) umount2(mount.c_str(), MNT_DETACH);
  RemoveTree(dir);
  RemoveTree(mount);
}

}  // namespace
}  // namespace shmcache::test
