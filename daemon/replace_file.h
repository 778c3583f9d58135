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

// Makes sure ReplaceFile can write `path` (a fixed name in a directory
// others may write: the sessions list and spill record in /dev/shm): OK
// when nothing is there or a file of ours (regular, this uid, mode 0600,
// one link) is. Anything else (a directory, which a rename cannot replace;
// a link; another user's file) is removed, a directory only when empty,
// and *removed says what it was ("" otherwise); when this user may not
// remove it (another user's, in a sticky dir), PermissionDenied naming it,
// `what` the file is, and the fix.
Status ClaimFileName(const std::string& path, const std::string& what,
                     std::string* removed);

}  // namespace shmcache
