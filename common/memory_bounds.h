// The server's memory cap: the smallest of what the user asks (-r of
// physical memory, or --memory_cap_mb), the same ratio of the memory limit
// of the server's cgroup, and the room in the shm filesystem it uses. In a
// container the host's RAM says little: the cgroup limit and the size of
// /dev/shm (64 MB by default in Docker) are what can really be had.
#pragma once

#include <cstdint>
#include <string>

namespace shmcache {

// Names of the bounds, as --server_info and the metrics show them.
inline constexpr const char* kBoundPhysical = "physical_memory";
inline constexpr const char* kBoundCapMb = "memory_cap_mb";
inline constexpr const char* kBoundCgroup = "cgroup";
inline constexpr const char* kBoundShm = "shm_filesystem";

struct MemoryBounds {
  uint64_t requested_bytes = 0;            // -r x physical memory, or --memory_cap_mb
  const char* requested = kBoundPhysical;  // which of the two
  uint64_t cgroup_limit_bytes = 0;         // smallest limit up the hierarchy; 0: none
  std::string cgroup_file;                 // the file that set it
  uint64_t cgroup_bytes = 0;               // ratio x cgroup_limit_bytes; 0: none
  uint64_t shm_bytes = 0;                  // room in the shm filesystem
  uint64_t cap_bytes = 0;                  // the smallest of the above
  const char* bound = kBoundPhysical;      // the one that applies
};

// The memory limit of this process's cgroup: the smallest memory.max
// (cgroup v2) or memory.limit_in_bytes (v1) from its own cgroup up to the
// root; 0 when none is set. `root` prefixes every path read (/proc/self/
// cgroup, /proc/self/mountinfo, the cgroup files); "" in production, a
// fake tree in tests. *file (may be null) names the file of the limit.
uint64_t CgroupMemoryLimit(const std::string& root, std::string* file);

// The bounds for `ratio` / `cap_bytes` (--memory_cap_mb, 0: none) given
// the cgroup limit read under `root` and `shm_room` bytes of shm filesystem.
MemoryBounds ComputeMemoryBounds(double ratio, uint64_t cap_bytes, uint64_t shm_room,
                                 const std::string& root = "");

// "docker", "kubernetes" or "" (not seen to run in a container), from
// KUBERNETES_SERVICE_HOST, /.dockerenv and /proc/1/cgroup under `root`.
std::string ContainerKind(const std::string& root = "");

// One line: the shm filesystem at `shm_dir` has `room` bytes, less than
// `wanted` (named by `what`, e.g. "the memory cap asked by -r 0.8"), and
// the exact remedy where this runs (`container` as ContainerKind says).
std::string ShmTooSmallRemedy(const std::string& shm_dir, uint64_t room, uint64_t wanted,
                              const std::string& what, const std::string& container);

}  // namespace shmcache
