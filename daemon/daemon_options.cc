#include "daemon_options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "cache_state.h"
#include "instance.h"
#include "parse_number.h"

namespace shmcache {

Status CheckSpillDir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') {
    return Status::InvalidArgument("spill directory '" + dir +
                                   "' is not an absolute path");
  }
  if (access(dir.c_str(), F_OK) != 0) {
    return Status::InvalidArgument("spill directory " + dir + " does not exist");
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status::InvalidArgument("spill directory " + dir + " is not writable");
  }
  return Status::OK();
}

static uint64_t PhysicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page : 0;
}

uint64_t MemoryCapBytes(double ratio, uint64_t cap_bytes) {
  if (cap_bytes) return cap_bytes;
  return static_cast<uint64_t>(static_cast<double>(PhysicalMemory()) * ratio);
}

Status CheckMemoryCap(double ratio, uint64_t cap_bytes) {
  constexpr uint64_t kMin = CacheState::kMinSegmentBytes;
  uint64_t cap = MemoryCapBytes(ratio, cap_bytes);
  if (cap >= kMin) return Status::OK();
  if (cap_bytes) {
    return Status::InvalidArgument(fmt::format(
        "memory cap of {} MB is below one segment ({} MB); give "
        "--memory_cap_mb {} or more",
        cap_bytes >> 20, kMin >> 20, kMin >> 20));
  }
  return Status::InvalidArgument(fmt::format(
      "memory cap ratio {} of {} MB of memory gives {} MB, below one segment "
      "({} MB); use a larger -r",
      ratio, PhysicalMemory() >> 20, cap >> 20, kMin >> 20));
}

Status CheckMetricsFile(const std::string& path) {
  if (path.empty() || path[0] != '/' || path.back() == '/') {
    return Status::InvalidArgument("metrics file '" + path +
                                   "' is not an absolute file path");
  }
  size_t slash = path.rfind('/');
  std::string dir = path.substr(0, slash == 0 ? 1 : slash);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("metrics file directory " + dir +
                                   " does not exist; create it first");
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status::InvalidArgument("metrics file directory " + dir +
                                   " is not writable by this user");
  }
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("metrics file " + path + " is a directory");
  }
  return Status::OK();
}

Status ParseDaemonOptions(int argc, char** argv, DaemonOptions* o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--foreground") {
      o->foreground = true;
      continue;
    }
    auto eq = a.find('=');
    if (a.substr(0, 2) != "--" || eq == std::string_view::npos) {
      return Status::InvalidArgument("unexpected argument '" + std::string(a) +
                                     "' (options are --name=value)");
    }
    std::string_view k = a.substr(2, eq - 2), v = a.substr(eq + 1);
    long n = 0;
    auto bad = [&] {
      return Status::InvalidArgument("bad value for --" + std::string(k) + ": '" +
                                     std::string(v) + "'");
    };
    if (k == "port") {
      if (!ParseDecimal(v, 1025, 65535, &n)) return bad();
      o->port = static_cast<int>(n);
    } else if (k == "workers") {
      if (!ParseDecimal(v, 1, 512, &n)) return bad();
      o->workers = static_cast<int>(n);
    } else if (k == "loglevel") {
      if (!ParseDecimal(v, 0, 4, &n)) return bad();
      o->log_level = static_cast<int>(n);
    } else if (k == "ready_fd") {
      if (!ParseDecimal(v, 0, 1 << 20, &n)) return bad();
      o->ready_fd = static_cast<int>(n);
    } else if (k == "watch_pid") {
      if (!ParseDecimal(v, 1, 1L << 30, &n)) return bad();
      o->watch_pid = static_cast<int>(n);
    } else if (k == "spilldir") {
      o->spill_dir = v;
    } else if (k == "run_dir") {
      o->run_dir = v;
    } else if (k == "shm_dir") {
      o->shm_dir = v;
    } else if (k == "log_dir") {
      o->log_dir = v;
    } else if (k == "memory_cap_ratio") {
      std::string s(v);
      char* end = nullptr;
      double r = std::strtod(s.c_str(), &end);
      if (s.empty() || *end != '\0' || !(r > 0.0 && r <= 1.0)) return bad();
      o->memory_cap_ratio = r;
    } else if (k == "metrics_file") {
      if (v.empty() || v[0] != '/') return bad();
      o->metrics_file = v;
    } else if (k == "metrics_interval") {
      if (!ParseDecimal(v, 1, 3600, &n)) return bad();
      o->metrics_interval_s = static_cast<int>(n);
    } else if (k == "memory_cap_mb") {
      if (!ParseDecimal(v, 1, 1L << 40, &n)) return bad();
      o->memory_cap_bytes = static_cast<uint64_t>(n) << 20;
    } else if (k == "stall_timeout_ms") {  // not in the admin CLI: for tests
      if (!ParseDecimal(v, 1, 1L << 30, &n)) return bad();
      o->stall_timeout_ms = static_cast<int>(n);
    } else if (k == "body_bytes_cap_mb") {  // not in the admin CLI: for tests
      if (!ParseDecimal(v, 1, 1L << 20, &n)) return bad();
      o->body_bytes_cap = static_cast<uint64_t>(n) << 20;
    } else {
      return Status::InvalidArgument("unknown option --" + std::string(k));
    }
  }
  Status s = CheckMemoryCap(o->memory_cap_ratio, o->memory_cap_bytes);
  if (!s.ok()) return s;
  if (!o->spill_dir.empty()) {
    s = CheckSpillDir(o->spill_dir);
    if (!s.ok()) return s;
  }
  if (!o->metrics_file.empty()) {
    s = CheckMetricsFile(o->metrics_file);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace shmcache
