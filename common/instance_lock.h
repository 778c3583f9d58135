// The instance lock: <run dir>/shmcached-<port>.lock (format/instance.h). A
// server holds an exclusive flock on it for its whole life, so that one
// server runs per instance, and writes its process id into it for
// messages. The kernel drops the lock when the process dies, however it
// dies; the pid in the file is never trusted by itself.
#pragma once

#include <string>

#include "shmcache/status.h"

namespace shmcache {

// The process id written in the lock file open as `fd`: > 0, or 0 when the
// file holds none (empty, not a number, out of range).
int ReadLockPid(int fd);

// Takes the lock for the life of the process and writes this process's id
// into it; *fd_out is the open file, to be closed last. AlreadyExists,
// naming the port and the holder's pid, when another server holds it.
Status TakeInstanceLock(const std::string& lock_path, int port, int* fd_out);

// Takes the host-wide lock of (this user, port) at `lock_path` (instance.h
// HostLockPath) for the life of the process and writes this process's id
// and `run_dir` into it; *fd_out is the open file, to be closed last,
// after ReleaseHostLock. The directory is shared with other users: a link
// is never followed, and a file that is not a regular file of this user
// is refused (PermissionDenied naming its owner and the fix). Another
// server of this user on the port, whatever its run dir, is
// AlreadyExists naming its process id and run dir.
Status TakeHostLock(const std::string& lock_path, int port, const std::string& run_dir,
                    int* fd_out);
// Removes the file of a host lock taken as `fd`, while still holding it
// (a server that opened it meanwhile finds it unlinked and tries again).
void ReleaseHostLock(const std::string& lock_path, int fd);

// Whether a process holds the lock: *held, and *pid the id it wrote (0 when
// none is readable yet: it has only just taken the lock). A missing file
// is a lock nobody holds.
Status ProbeInstanceLock(const std::string& lock_path, bool* held, int* pid);

}  // namespace shmcache
