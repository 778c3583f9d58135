#include "logger.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

namespace shmcache {

static Status MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      std::string part = dir.substr(0, i);
      if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
        return Status::FromErrno("cannot create log directory " + part, errno);
      }
    }
  }
  return Status::OK();
}

Status Logger::Open(const std::string& dir, int level) {
  Status s = MakeDirs(dir);
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
  path_ = fmt::format("{}/shmcached.{}.{}.{}.{}.log", dir, host, user, getpid(),
                      date);
  int fd = open(path_.c_str(),
                O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC,
                0600);
  if (fd < 0) return Status::FromErrno("cannot create log file " + path_, errno);
  file_ = fdopen(fd, "a");
  if (file_ == nullptr) {
    int e = errno;
    close(fd);
    return Status::FromErrno("cannot open log file " + path_, e);
  }
  level_ = level;
  return Status::OK();
}

void Logger::Log(LogLevel level, std::string_view msg) {
  if (static_cast<int>(level) < level_ || file_ == nullptr) return;
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  localtime_r(&tv.tv_sec, &t);
  char ts[32];
  strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &t);
  static const char kLetters[] = "DIWEF";
  std::lock_guard lock(mu_);
  fmt::print(file_, "{}.{:03d} {} {} {}\n", ts, tv.tv_usec / 1000,
             kLetters[static_cast<int>(level)], getpid(), msg);
  fflush(file_);
}

}  // namespace shmcache
