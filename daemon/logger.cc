#include "daemon/logger.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>

namespace shmcache {
namespace {

namespace fs = std::filesystem;

// mkdir -p, each directory it makes owner-only.
Status MakeOwnerOnlyDirs(const std::string& dir) {
  fs::path part;
  for (const fs::path& name : fs::path(dir)) {
    part /= name;
    std::error_code ec;
    if (fs::create_directory(part, ec)) {
      fs::permissions(part, fs::perms::owner_all, ec);
    }
    if (ec) {
      return Status::FromErrno("cannot create log directory " + part.string(),
                               ec.value());
    }
  }
  return Status::OK();
}

// A new log file at `path`: never an existing file, never through a link.
FILE* CreateLogFile(const std::string& path, int* err) {
  int fd = open(path.c_str(),
                O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE* f = fd >= 0 ? fdopen(fd, "a") : nullptr;
  *err = errno;
  if (f == nullptr && fd >= 0) close(fd);
  return f;
}

}  // namespace

Logger::~Logger() {
  if (file_ != nullptr) fclose(file_);
}

Status Logger::Open(const std::string& dir, int level, uint64_t rotate_bytes) {
  Status s = MakeOwnerOnlyDirs(dir);
  if (!s.ok()) return s;
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const passwd* pw = getpwuid(geteuid());
  std::string user = pw ? pw->pw_name : std::to_string(geteuid());
  time_t now = time(nullptr);
  tm t;
  localtime_r(&now, &t);
  char date[32];
  strftime(date, sizeof date, "%Y%m%d-%H%M%S", &t);
  path_ = fmt::format("{}/shmcached.{}.{}.{}.{}.log", dir, host, user, getpid(), date);
  int err = 0;
  FILE* file = CreateLogFile(path_, &err);
  if (file == nullptr) return Status::FromErrno("cannot create log file " + path_, err);
  level_ = level;
  MutexLock lock(&mu_);
  file_ = file;
  rotate_bytes_ = rotate_bytes;
  return Status::OK();
}

// The current file becomes <path>.1; a fresh one takes its name. If that
// fails, logging goes on in the renamed file, unrotated from then on.
void Logger::RotateLocked() {
  written_ = 0;
  std::string old = path_ + ".1";
  if (rename(path_.c_str(), old.c_str()) != 0) {
    fmt::print(file_, "cannot rotate the log to {}: {}; it grows on\n", old,
               std::strerror(errno));
    rotate_bytes_ = std::numeric_limits<uint64_t>::max();
    return;
  }
  int err = 0;
  FILE* fresh = CreateLogFile(path_, &err);
  if (fresh == nullptr) {
    fmt::print(file_, "cannot begin a new log file {}: {}; logging on here\n", path_,
               std::strerror(err));
    rotate_bytes_ = std::numeric_limits<uint64_t>::max();
    return;
  }
  fclose(file_);
  file_ = fresh;
}

void Logger::Log(LogLevel level, std::string_view msg) {
  if (static_cast<int>(level) < level_) return;
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  localtime_r(&tv.tv_sec, &t);
  char ts[32];
  strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &t);
  static const char kLetters[] = "DIWEF";
  std::string line = fmt::format("{}.{:03d} {} {} {}\n", ts, tv.tv_usec / 1000,
                                 kLetters[static_cast<int>(level)], getpid(), msg);
  MutexLock lock(&mu_);
  if (file_ == nullptr) return;
  fwrite(line.data(), 1, line.size(), file_);
  fflush(file_);
  written_ += line.size();
  if (written_ >= rotate_bytes_) RotateLocked();
}

}  // namespace shmcache
