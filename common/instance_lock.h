// The instance lock: <run dir>/shmcached-<port>.lock (format/instance.h). A
// server holds an exclusive flock on it for its whole life, so that one
// server runs per instance, and writes its identity into it (its pid,
// start and boot: process_identity.h), for messages and for --stop. The
// kernel drops the lock when the process dies, however it dies; the pid in
// the file is never trusted by itself: for an instant after a server has
// taken the lock, until it writes its own, the file still names the
// previous holder, whose pid may be another process's by then
// (CheckOwner tells).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "common/process_identity.h"
#include "shmcache/status.h"

namespace shmcache {

// The process the lock file open as `fd` names (its first line,
// IdentityText): pid 0 when it names none (empty, not written whole, not a
// number, out of range); no start when an older version wrote it.
ProcessIdentity ReadLockOwner(int fd);

// Takes the lock for the life of the process and writes this process's
// identity into it; *fd_out is the open file, to be closed last. A holder
// that is ending (killed, its last threads still exiting: ProcessEnding) is
// waited for, up to 10 s: a restart right after a kill or a crash is not
// refused; so are readers alone holding it (the shared lock of a probe
// below, a moment long: a client whose connect failed, --stop), and
// Unavailable when they keep it that long. AlreadyExists,
// naming the port and the holder's pid, when another server holds it. A
// link is never followed: it, or anything that is not a regular file of
// this user, is refused (PermissionDenied naming it and the fix).
Status TakeInstanceLock(const std::string& lock_path, int port, int* fd_out);

// Takes the host-wide lock of (this user, port) at `lock_path` (instance.h
// HostLockPath) for the life of the process and writes this process's
// identity and `run_dir` into it; *fd_out is the open file, to be closed last,
// after ReleaseLockFile. The directory is shared with other users: a link
// is never followed, and a file that is not a regular file of this user
// is refused (PermissionDenied naming its owner and the fix). An ending
// holder or readers are waited for as TakeInstanceLock says. Another
// server of this user on the port, whatever its run dir, is
// AlreadyExists naming its process id and run dir.
Status TakeHostLock(const std::string& lock_path, int port, const std::string& run_dir,
                    int* fd_out);
// Removes the file of a lock taken as `fd` (either lock), while still
// holding it, and only while it is still the file at `lock_path`: a server
// that opened it meanwhile finds it unlinked and tries again (both Take
// functions re-check, after their flock, that the file they locked is the
// one at the path).
void ReleaseLockFile(const std::string& lock_path, int fd);

// Both locks of a running server, its instance's and the host's, held for
// as long as the object lives: destroyed, it closes them (the kernel drops
// the flocks). A server that stops removes their files first
// (RemoveFiles), while it still holds them, and so does one refused at
// set-up (daemon/main.cc: its shm dir), or later while its shm dir holds
// nothing of the instance; one refused with an earlier server's files
// there leaves them, as a killed one would (for --stop to count): the
// next start takes them again.
class InstanceLocks {
 public:
  // Takes the lock at `lock_path` (TakeInstanceLock), then the host lock at
  // `host_lock_path` (TakeHostLock) naming `run_dir`; the first's errors,
  // or the second's (the first then released, its file removed).
  static Status Take(const std::string& lock_path, const std::string& host_lock_path,
                     int port, const std::string& run_dir,
                     std::unique_ptr<InstanceLocks>* out);
  ~InstanceLocks();
  InstanceLocks(const InstanceLocks&) = delete;
  InstanceLocks& operator=(const InstanceLocks&) = delete;

  // Adds the shm dir the server chose (its huge-page dir, or the one it was
  // given) to the host lock's text, for ProbeHostLock.
  void NoteShmDir(const std::string& shm_dir);
  // Adds that the server listens on its socket (after NoteShmDir), for
  // ProbeHostLock: a client that finds no socket is told the server is
  // starting before, and that its socket was removed after.
  void NoteServing();
  // Unlinks both files while holding them (ReleaseLockFile).
  void RemoveFiles();

 private:
  InstanceLocks(std::string lock_path, std::string host_lock_path, int fd, int host_fd,
                std::string run_dir)
      : lock_path_(std::move(lock_path)),
        host_lock_path_(std::move(host_lock_path)),
        fd_(fd),
        host_fd_(host_fd),
        run_dir_(std::move(run_dir)) {}

  const std::string lock_path_;
  const std::string host_lock_path_;
  const int fd_;
  const int host_fd_;
  const std::string run_dir_;
  std::string shm_dir_;  // NoteShmDir's
};

// Whether a process of this user holds the lock: *held, and *owner what
// the file names (pid 0 when nothing is readable yet: it has only just
// taken the lock; the previous holder, whose pid may be another's now,
// until it writes its own: check with CheckOwner). A missing file, or one
// that is not a regular file of this user (planted: no server of this user
// can take it), is a lock nobody holds. Never blocks.
Status ProbeInstanceLock(const std::string& lock_path, bool* held,
                         ProcessIdentity* owner);
// The same for the host lock (TakeHostLock): its holder, with the run dir
// and shm dir it wrote ("" when not readable yet: the run dir is written
// as the lock is taken, the shm dir once the server has chosen it,
// InstanceLocks::NoteShmDir), and whether it listens yet (NoteServing). The one reader of
// the host lock, for the admin and for libshmcache's failed connects
// (server_elsewhere.h): read only (a shared flock tried without waiting, dropped as the
// file is closed), never through a link, never blocking (a FIFO there cannot hold it);
// anything but this user's own regular file is "none" (not held); *out is "none" too when
// the file cannot be opened (then the error). Thread-safe.
struct HostLockHolder {
  bool held = false;
  ProcessIdentity owner;
  std::string run_dir;
  std::string shm_dir;
  bool serving = false;
};
Status ProbeHostLock(const std::string& lock_path, HostLockHolder* out);

}  // namespace shmcache
