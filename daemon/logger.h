// Logger: the daemon's log file. One line per event:
//   2026-11-21 05:30:01.123 W 4242 message
// Levels: 0 debug, 1 info, 2 warning, 3 error, 4 fatal only.
// Thread safety: Log() may be called from any thread.
#pragma once

#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "shmcache/status.h"

namespace shmcache {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

class Logger {
 public:
  // Creates <dir>/shmcached.<host>.<user>.<pid>.<YYYYMMDD-HHMMSS>.log,
  // owner-only (0600): logs name sessions, caches and paths. Missing
  // directories on the way are created owner-only (0700); existing ones are
  // left as they are. A file of that name already there is an error, never
  // followed or reused.
  Status Open(const std::string& dir, int level);
  const std::string& path() const { return path_; }

  void Log(LogLevel level, std::string_view msg);
  template <typename... Args>
  void Info(fmt::format_string<Args...> f, Args&&... args) {
    Log(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void Warn(fmt::format_string<Args...> f, Args&&... args) {
    Log(LogLevel::kWarning, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void Error(fmt::format_string<Args...> f, Args&&... args) {
    Log(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void Debug(fmt::format_string<Args...> f, Args&&... args) {
    if (level_ <= 0) Log(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
  }

 private:
  std::mutex mu_;
  FILE* file_ = nullptr;
  int level_ = 1;
  std::string path_;
};

}  // namespace shmcache
