#include "spill_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fmt/format.h>

namespace shmcache {

namespace fs = std::filesystem;

static std::string DbName(int port) {
  return fmt::format("shmcache.{}.{}.spill", geteuid(), port);
}

std::string SpillDbPath(const std::string& spill_dir, int port) {
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(fs::absolute(spill_dir, ec), ec);
  if (ec) dir = spill_dir;  // compared as given
  return (dir / DbName(port)).string();
}

bool IsSpillDbOf(const std::string& path, int port) {
  return fs::path(path).filename() == DbName(port);
}

bool SameSpillDb(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return a == b;
  std::error_code ec;
  return a == b || fs::equivalent(a, b, ec);
}

std::string ReadSpillRecord(const InstancePaths& paths) {
  std::string text;
  if (FILE* f = fopen(paths.SpillRecordFile().c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    fclose(f);
  }
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

Status WriteSpillRecord(const InstancePaths& paths, const std::string& db_path) {
  std::string path = paths.SpillRecordFile();
  if (db_path.empty()) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::FromErrno("cannot remove " + path, errno);
    }
    return Status::OK();
  }
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno("cannot create " + tmp, errno);
  std::string line = db_path + "\n";
  bool written = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  int err = errno;
  close(fd);
  if (!written || rename(tmp.c_str(), path.c_str()) != 0) {
    if (written) err = errno;
    unlink(tmp.c_str());
    return Status::FromErrno("cannot write " + path, err);
  }
  return Status::OK();
}

}  // namespace shmcache
