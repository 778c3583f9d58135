#include "common/instance_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string_view>

namespace shmcache {

InstanceFiles CountInstanceFiles(const std::string& dir, const std::string& prefix) {
  InstanceFiles out;
  // O_NOFOLLOW: the huge-page dir is a name in /dev/shm, open to all.
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return out;
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return out;
  }
  for (dirent* e = readdir(d); e != nullptr; e = readdir(d)) {
    struct stat st {};
    if (std::string_view(e->d_name).rfind(prefix, 0) != 0 ||
        fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
      continue;
    }
    ++out.files;
    out.bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  closedir(d);
  out.listed = true;
  return out;
}

}  // namespace shmcache
