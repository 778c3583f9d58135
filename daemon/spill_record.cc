#include "spill_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "replace_file.h"
#include "shm_file.h"

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

std::string ReadSpillRecord(const InstancePaths& paths, std::string* refused) {
  std::string text;
  int fd = -1;
  // The record names a directory a restarted daemon may destroy: one that
  // someone else wrote (or linked) is never believed.
  Status s = OpenOwnedFile(paths.SpillRecordFile(), O_RDONLY, &fd);
  if (!s.ok()) {
    if (!s.IsNotFound() && refused != nullptr) *refused = s.message();
    return text;
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(fd);
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
  return ReplaceFile(path, db_path + "\n", 0600);
}

}  // namespace shmcache
