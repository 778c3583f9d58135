#include "daemon/spill_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "daemon/replace_file.h"
#include "format/shm_file.h"

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
