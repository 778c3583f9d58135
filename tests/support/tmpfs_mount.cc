#include "tests/support/tmpfs_mount.h"

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tests/support/files.h"

namespace shmcache::test {

TmpfsMount::TmpfsMount(const std::string& size) {
  if (geteuid() != 0) {
    skip_reason_ = "needs root to mount a small tmpfs";
    return;
  }
  path_ = MakeTempDir(TestTmpRoot(), "tinyspill");
  if (path_.empty()) {  // MakeTempDir failed the test
    skip_reason_ = "cannot make a directory to mount a tmpfs on";
    return;
  }
  const std::string options = "size=" + size;
  if (mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
    skip_reason_ = std::string("cannot mount a tmpfs here: ") + std::strerror(errno);
    RemoveTree(path_);
    path_.clear();
    return;
  }
  mounted_ = true;
}

TmpfsMount::~TmpfsMount() {
  // Detached: a process of the test still holding a file there (a server
  // that failed to stop) does not keep the mount.
  if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  if (!path_.empty()) RemoveTree(path_);
}

}  // namespace shmcache::test
