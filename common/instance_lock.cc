#include "instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <fmt/format.h>

#include "parse_number.h"

namespace shmcache {

int ReadLockPid(int fd) {
  char buf[32] = {};
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  long pid = 0;
  if (n > 0) LeadingLong(std::string_view(buf, static_cast<size_t>(n)), &pid);
  return pid > 0 && pid <= INT_MAX ? static_cast<int>(pid) : 0;
}

Status TakeInstanceLock(const std::string& lock_path, int port, int* fd_out) {
  int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno("cannot open " + lock_path, errno);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int pid = ReadLockPid(fd);
    close(fd);
    return Status::AlreadyExists(fmt::format(
        "a cache server is already running on port {} (process id {}); stop it "
        "with 'shmcache --stop -p {}' or use another port",
        port, pid > 0 ? std::to_string(pid) : "?", port));
  }
  std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The lock is what matters; the pid is only for messages.
  }
  *fd_out = fd;
  return Status::OK();
}

Status ProbeInstanceLock(const std::string& lock_path, bool* held, int* pid) {
  *held = false;
  *pid = 0;
  int fd = open(lock_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::FromErrno("cannot open " + lock_path, errno);
  }
  // A shared lock is granted only while no server holds the exclusive one;
  // closing the file drops it again.
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
    *held = true;
    *pid = ReadLockPid(fd);
  }
  close(fd);
  return Status::OK();
}

}  // namespace shmcache
