// Directories the server keeps where other users may write: its run dir
// (in /tmp, world-writable) and its spill database (in a spill dir that may
// be shared). A fixed name there may already hold something another user
// put: a symbolic link to a third user's directory, or a directory of
// theirs. None of it is ever taken for ours, as OpenOwnedFile
// (shm_file.h) does for files.
//
// Thread safety: no state; safe from any thread.
#pragma once

#include <sys/types.h>

#include <string>

#include "shmcache/status.h"

namespace shmcache {

// "alice (uid 1000)", or "uid 1000" when the user has no name.
std::string OwnerName(uid_t uid);

// What is at `path`, never following a link there: "a symbolic link owned
// by nobody (uid 65534)", "a directory owned by root (uid 0), mode 0755",
// "nothing" when it does not exist.
std::string DescribeEntry(const std::string& path);

// Opens directory `path` as this user's own, creating it mode 0700 (whatever
// the umask) when it is missing and `create`. A link at `path` is never
// followed (O_NOFOLLOW). Taken only when it is a directory owned by the
// effective uid that no other user may write into; anything else is
// PermissionDenied naming the path, what is there and `fix` (the caller's
// way out: "remove it ... or start with another -s DIR"). A directory of
// ours that others may only read or search (made by mkdir -p, or by an
// earlier version) is made 0700 through the descriptor, and *tightened
// (when given) says so; otherwise it is left "". NotFound when it is missing
// and !create; IOError saying to create it first when a directory above
// it is missing (create). On success the caller owns *fd (O_RDONLY | O_DIRECTORY).
Status OpenOwnedDir(const std::string& path, bool create, const std::string& fix, int* fd,
                    std::string* tightened = nullptr);

// OK when no user but root and this one can change what the absolute,
// link-free path `path` names: every directory from / down to the one
// holding its last component (opened one by one, never through a link)
// belongs to root or to the effective uid, and one that others may write
// is sticky (then others can neither rename nor remove what root or we
// own in it). Otherwise PermissionDenied naming the first directory that
// fails and why: someone could put a link in place of a component and
// send whatever opens `path` somewhere else.
Status CheckNoOtherUserCanReplace(const std::string& path);

}  // namespace shmcache
