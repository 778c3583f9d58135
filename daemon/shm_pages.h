// Which pages back the shm dir, for the start-up log. Filling a cold cache
// is bound by the kernel's cost per page (allocating and mapping a 4 KB
// page of tmpfs costs about 1.5 us on the project's VM), so a tmpfs with
// huge pages fills several times faster; the log says which one the
// server got, and how to get huge pages when it has none.
// Thread safety: stateless.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shmcache {

// The size of a huge page of tmpfs. Segment pages are supplied, and a
// segment's carved part copied, in whole units of it, so that a tmpfs with
// huge pages never backs a row with a part of one.
inline constexpr uint64_t kHugePageBytes = 2u << 20;

inline constexpr const char* kMountsFile = "/proc/self/mounts";
inline constexpr const char* kShmemEnabledFile =
    "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
// The whole text of a small file (/proc, /sys); "" when it cannot be read.
std::string ReadTextFile(const char* path);

// One line of /proc/self/mounts.
struct MountEntry {
  std::string point, type, options;
};
// The mount holding `dir` (the longest mount point it lies under), from the
// text of /proc/self/mounts; all fields empty when none is found.
MountEntry MountOf(const std::string& dir, std::string_view mounts);
// The value of `key=` in a comma-separated mount option list, or "".
std::string MountOption(std::string_view options, std::string_view key);
// Whether a tmpfs mount option huge= asks for huge pages.
bool HugeOption(const std::string& huge);

struct ShmPages {
  bool huge = false;
  std::string why;    // e.g. "tmpfs mounted huge=within_size"
  bool disk = false;  // the dir is on a filesystem of a disk's (not tmpfs, ramfs)
};

// From the text of /proc/self/mounts and of
// /sys/kernel/mm/transparent_hugepage/shmem_enabled ("" when absent).
// `dir` is an absolute path without symbolic links.
ShmPages ShmPagesOf(const std::string& dir, std::string_view mounts,
                    std::string_view shmem_enabled);
// Reads both files for `dir` (resolved first).
ShmPages ShmPagesOf(const std::string& dir);

// The start-up log line for `dir`.
std::string ShmPagesNote(const std::string& dir, const ShmPages& pages);

}  // namespace shmcache
