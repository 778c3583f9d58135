// The files a cache server instance leaves in a shm dir: what --stop
// counts of a killed server, and what a server that failed to start checks
// before it removes its lock files.
//
// Thread safety: a pure function of the filesystem. Errors: a directory
// that cannot be opened (or is a link) holds none.
#pragma once

#include <cstdint>
#include <string>

namespace shmcache {

struct InstanceFiles {
  int files = 0;
  uint64_t bytes = 0;  // allocated, not apparent
  // The directory was read: false when it could not be opened (or is a
  // link), where no count says it holds nothing.
  bool listed = false;
};

// This user's regular files in `dir` whose names start with `prefix` (an
// instance's name without the directory: format/instance.h's shm_prefix
// past its dir), never through a link.
InstanceFiles CountInstanceFiles(const std::string& dir, const std::string& prefix);

}  // namespace shmcache
