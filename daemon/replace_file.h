// ReplaceFile: gives a file new contents all at once. The text goes to a
// fresh file of an unpredictable name beside `path` (O_CREAT | O_EXCL |
// O_NOFOLLOW: never a file or link someone else put there, which matters in
// /dev/shm and in shared directories), gets `mode` whatever the umask, and
// is renamed over `path`; a reader sees the old file or the new one, never
// a partial one. On error the temporary file is removed and `path` is as
// it was. The daemon's sessions list, spill record and metrics file use it.
// Thread safety: safe to call concurrently for different paths.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "shmcache/status.h"

namespace shmcache {

Status ReplaceFile(const std::string& path, std::string_view text, mode_t mode);

}  // namespace shmcache
