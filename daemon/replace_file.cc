#include "daemon/replace_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>

#include <fmt/format.h>

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
  std::string tmp = fmt::format("{}.tmp.{:08x}", path, std::random_device{}());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
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

}  // namespace shmcache
