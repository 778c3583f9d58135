// Logger: the daemon's log file. One line per event:
//   2026-11-21 05:30:01.123 W 4242 message
// Levels: 0 debug, 1 info, 2 warning, 3 error, 4 fatal only. Past a size
// the file rotates: it is renamed to <path>.1 (replacing an older one) and
// a new file begins at path(), so a server that runs for months keeps at
// most twice that size on disk.
//
// Ours rather than spdlog's: the file must be created owner-only, never
// through a symbolic link and never reused (O_CREAT|O_EXCL|O_NOFOLLOW,
// 0600), which spdlog's file sinks (fopen) cannot do without a sink of our
// own; with one, spdlog would bring levels we already have and a rotation
// that is ten lines here, for a dependency more.
//
// Thread safety: Log() may be called from any thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "port/mutex.h"
#include "shmcache/status.h"

namespace shmcache {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

class Logger {
 public:
  static constexpr uint64_t kDefaultRotateBytes = 64u << 20;

  ~Logger();

  // Creates <dir>/shmcached.<host>.<user>.<pid>.<YYYYMMDD-HHMMSS>.log,
  // owner-only (0600): logs name sessions, caches and paths. Missing
  // directories on the way are created owner-only (0700); existing ones are
  // left as they are. A file of that name already there is an error, never
  // followed or reused. The file rotates once it holds `rotate_bytes`.
  Status Open(const std::string& dir, int level,
              uint64_t rotate_bytes = kDefaultRotateBytes) EXCLUDES(mu_);
  const std::string& path() const { return path_; }

  void Log(LogLevel level, std::string_view msg) EXCLUDES(mu_);
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
  void RotateLocked() REQUIRES(mu_);

  Mutex mu_;
  FILE* file_ GUARDED_BY(mu_) = nullptr;
  // level_ and path_ are set by Open, before any other thread logs.
  int level_ = 1;
  std::string path_;
  // Rotation turns off (the maximum) when it fails.
  uint64_t rotate_bytes_ GUARDED_BY(mu_) = kDefaultRotateBytes;
  uint64_t written_ GUARDED_BY(mu_) = 0;  // bytes in the current file
};

}  // namespace shmcache
