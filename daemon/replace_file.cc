#include "daemon/replace_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "format/owned_dir.h"

namespace shmcache {

static bool WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

Status ReplaceFile(const std::string& path, std::string_view text, mode_t mode) {
  std::string tmp;
  int fd = -1;
  // A name someone else took (they would have to guess it) is skipped.
  for (int attempt = 0; attempt < 4 && fd < 0; ++attempt) {
    tmp = fmt::format("{}.tmp.{:08x}", path, std::random_device{}());
    fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return Status::FromErrno("cannot create " + tmp, errno);
  // The umask may have narrowed the mode (readers may check it).
  bool ok = fchmod(fd, mode) == 0 && WriteAll(fd, text);
  int err = errno;
  ok = close(fd) == 0 && ok;
  if (ok && rename(tmp.c_str(), path.c_str()) == 0) return Status::OK();
  if (ok) err = errno;
  unlink(tmp.c_str());
  return Status::FromErrno("cannot write " + path, err);
}

Status ClaimFileName(const std::string& path, const std::string& what,
                     std::string* removed) {
  removed->clear();
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::FromErrno("cannot look at " + path, errno);
  }
  if (S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 07777) == 0600 &&
      st.st_nlink == 1) {
    return Status::OK();
  }
  const std::string there = DescribeEntry(path);
  if ((S_ISDIR(st.st_mode) ? rmdir(path.c_str()) : unlink(path.c_str())) != 0) {
    return Status::PermissionDenied(fmt::format(
        "{} {} cannot be written: {} is there ({}); have it removed (as its owner or "
        "root) or start the server with another --shm_dir or port",
        what, path, there, std::strerror(errno)));
  }
  *removed = there;
  return Status::OK();
}

}  // namespace shmcache
