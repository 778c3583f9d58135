#include "daemon/huge_tmpfs.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <fmt/format.h>

#include "daemon/shm_pages.h"
#include "format/align.h"
#include "format/instance.h"
#include "format/parse_number.h"

namespace shmcache {
namespace {

constexpr const char* kDevShm = "/dev/shm";

// CAP_SYS_ADMIN (bit 21) in the effective set: what mount(2) needs.
bool HasSysAdmin() {
  std::istringstream status(ReadTextFile("/proc/self/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    uint64_t caps = 0;
    LeadingInteger(std::string_view(line).substr(7), &caps, 16);
    return (caps >> 21) & 1;
  }
  return false;
}

// Why the kernel cannot give this tmpfs huge pages, or "".
std::string NoShmemThp() {
  if (access(kShmemEnabledFile, R_OK) != 0) {
    return "the kernel has no transparent huge pages for tmpfs";
  }
  if (ReadTextFile(kShmemEnabledFile).find("[deny]") != std::string::npos) {
    return fmt::format("{} is deny; echo advise > {} to allow them", kShmemEnabledFile,
                       kShmemEnabledFile);
  }
  return "";
}

ShmDirChoice Fallback(const std::string& why, std::string note = "") {
  ShmDirChoice c;
  c.dir = kDevShm;
  c.log_line = fmt::format("{}; no huge-page tmpfs of its own: {}",
                           ShmPagesNote(c.dir, ShmPagesOf(c.dir)), why);
  c.note = std::move(note);
  c.why_not_huge = why;
  return c;
}

// A fallback for something wrong at the mount path: the log line and a NOTE.
ShmDirChoice Refuse(const std::string& what) {
  std::string note = fmt::format("{}; using {} with 4 KB pages", what, kDevShm);
  return Fallback(what, note);
}

std::string MountData(uint64_t bytes, bool with_owner) {
  std::string data = fmt::format("huge=within_size,size={}k", bytes >> 10);
  if (with_owner) data += fmt::format(",mode=0700,uid={},gid={}", geteuid(), getegid());
  return data;
}

// The mount at `dir` when it is a huge tmpfs of its own: adopted, resized.
ShmDirChoice Adopt(const std::string& dir, int fd, uint64_t bytes) {
  MountEntry m = MountOf(dir, ReadTextFile(kMountsFile));
  std::string huge = MountOption(m.options, "huge");
  if (m.point != dir || m.type != "tmpfs" || !HugeOption(huge)) {
    return Refuse(
        fmt::format("{} is a mount point of something else ({} {}); not "
                    "using it: unmount it",
                    dir, m.type, m.options));
  }
  ShmDirChoice c{dir, true, true, "", "", ""};
  std::string target = fmt::format("/proc/self/fd/{}", fd);
  std::string resized = "resized";
  if (mount(nullptr, target.c_str(), nullptr,
            MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            MountData(bytes, false).c_str()) != 0) {
    resized = fmt::format("kept its size: {}", std::strerror(errno));
  }
  c.log_line = fmt::format(
      "shm dir {}: huge pages (tmpfs mounted huge={}), adopted from an earlier "
      "server of this port ({}, {} MB)",
      dir, huge, resized, bytes >> 20);
  return c;
}

ShmDirChoice MountAt(const std::string& dir, uint64_t bytes) {
  bool made = mkdir(dir.c_str(), 0700) == 0;
  if (!made && errno != EEXIST) {
    return Fallback(fmt::format("cannot create {}: {}", dir, std::strerror(errno)));
  }
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return Refuse(
        fmt::format("{} is not a directory (a symlink or a file someone "
                    "put there: {}); not following it: remove it",
                    dir, std::strerror(errno)));
  }
  struct stat st {
  }, shm{};
  if (fstat(fd, &st) != 0 || stat(kDevShm, &shm) != 0 || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    close(fd);
    return Refuse(
        fmt::format("{} belongs to uid {} with mode {:o}, not to this "
                    "server's uid {} with mode 700; not using it: remove it",
                    dir, st.st_uid, st.st_mode & 07777, geteuid()));
  }
  ShmDirChoice c;
  if (st.st_dev != shm.st_dev) {
    c = Adopt(dir, fd, bytes);
  } else if (mount("shmcache", fmt::format("/proc/self/fd/{}", fd).c_str(), "tmpfs",
                   MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   MountData(bytes, true).c_str()) != 0) {
    int err = errno;
    if (made) rmdir(dir.c_str());
    c = Refuse(fmt::format("cannot mount a tmpfs at {}: {}", dir, std::strerror(err)));
  } else {
    c = {dir, true, true, "", "", ""};
    c.log_line = fmt::format(
        "shm dir {}: huge pages (tmpfs mounted huge=within_size by this server, "
        "{} MB); a clean stop unmounts it, a killed server leaves it to the next",
        dir, bytes >> 20);
  }
  close(fd);
  return c;
}

}  // namespace

bool ShmDirGiven(const std::string& shm_dir_option) {
  const char* env = std::getenv("SHMCACHE_SHM_DIR");
  // Set but empty is given too: the server refuses it before this is asked
  // (CheckShmDirFromEnv).
  return !shm_dir_option.empty() || env != nullptr;
}

bool HugeTmpfsAsked() {
  const char* v = std::getenv("SHMCACHE_HUGE_TMPFS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

Status CheckHugeTmpfsEnv() {
  const char* v = std::getenv("SHMCACHE_HUGE_TMPFS");
  if (v == nullptr || std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0) {
    return Status::OK();
  }
  return Status::InvalidArgument(fmt::format(
      "SHMCACHE_HUGE_TMPFS='{}' is neither 0 nor 1; set it to 1 for a huge-page tmpfs "
      "of the server's own (as root), or to 0 or unset it for none",
      v));
}

uint64_t HugeTmpfsBytes(uint64_t memory_cap) {
  return AlignUp(memory_cap + (64u << 20), kHugePageBytes);
}

ShmDirChoice ChooseShmDir(int port, uint64_t tmpfs_bytes) {
  ShmPages dev_shm = ShmPagesOf(kDevShm);
  if (dev_shm.huge) return {kDevShm, true, false, ShmPagesNote(kDevShm, dev_shm), "", ""};
  if (std::string why = NoShmemThp(); !why.empty()) return Fallback(why);
  if (!HasSysAdmin()) {
    return Fallback("mounting one needs root (CAP_SYS_ADMIN): start the server as root");
  }
  return MountAt(HugeShmDir(port), tmpfs_bytes);
}

Status ReleaseHugeShmDir(const std::string& dir) {
  if (umount2(dir.c_str(), UMOUNT_NOFOLLOW) != 0 &&
      umount2(dir.c_str(), UMOUNT_NOFOLLOW | MNT_DETACH) != 0) {
    return Status::FromErrno(fmt::format("cannot unmount {}; umount it by hand", dir),
                             errno);
  }
  if (rmdir(dir.c_str()) != 0) {
    return Status::FromErrno(fmt::format("unmounted {} but cannot remove it", dir),
                             errno);
  }
  return Status::OK();
}

}  // namespace shmcache
