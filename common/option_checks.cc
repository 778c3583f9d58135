#include "common/option_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <string>

#include <fmt/format.h>

#include "format/instance.h"
#include "format/parse_number.h"

namespace shmcache {

// " (<why>)" when `text` is no number as typed (TypedNumberFlaw), else "".
static std::string FlawNote(std::string_view text) {
  std::string_view flaw = TypedNumberFlaw(text);
  return flaw.empty() ? "" : fmt::format(" ({})", flaw);
}

// A decimal in [lo, hi] written as digits alone (no white space, no '+').
static bool ParseTyped(std::string_view text, long lo, long hi, long* out) {
  return TypedNumberFlaw(text).empty() && ParseDecimal(text, lo, hi, out);
}

Status ParseInRange(std::string_view what, std::string_view text, long lo, long hi,
                    long* out) {
  if (ParseTyped(text, lo, hi, out)) return Status::OK();
  return Status::InvalidArgument(fmt::format("{} '{}' is not a number in {}..{}{}", what,
                                             text, lo, hi, FlawNote(text)));
}

Status ParseSessionId(std::string_view text, int port, uint32_t* id) {
  const std::string p = PortArg(port);
  const std::string where =
      fmt::format("list the sessions with 'shmcache --list_sessions{}'", p);
  long n = 0;
  if (!ParseTyped(text, 0, UINT32_MAX, &n)) {
    return Status::InvalidArgument(
        fmt::format("session id '{}' is not a number in 1..{}{}, as 'shmcache -g{}' "
                    "prints; {}",
                    text, UINT32_MAX, FlawNote(text), p, where));
  }
  // The server makes no session 0: a launcher exports 0 for "none" (the
  // Slurm prolog that could not create one), so the id is wrong, not gone.
  if (n == 0) {
    return Status::InvalidArgument(fmt::format(
        "session id 0 is no session: ids are 1..{}, as 'shmcache -g{}' prints (a "
        "launcher that could not create a session exports 0); {}",
        UINT32_MAX, p, where));
  }
  *id = static_cast<uint32_t>(n);
  return Status::OK();
}

// ParseInRange's refusal with what to give instead.
static Status WithFix(Status s, std::string_view fix) {
  if (s.ok()) return s;
  return Status::InvalidArgument(fmt::format("{}; {}", s.message(), fix));
}

Status ParseWorkers(std::string_view text, int* workers) {
  long n = 0;
  Status s = WithFix(ParseInRange("worker count", text, 1, 512, &n),
                     "give -w (--workers) a whole number of threads in 1..512, or leave "
                     "it out for half the CPUs");
  if (s.ok()) *workers = static_cast<int>(n);
  return s;
}

Status ParseLogLevel(std::string_view text, int* level) {
  long n = 0;
  Status s =
      WithFix(ParseInRange("log level", text, 0, 4, &n),
              "give -l (--loglevel) 0 (debug), 1 (info, the default), 2 (warning), "
              "3 (error) or 4 (fatal)");
  if (s.ok()) *level = static_cast<int>(n);
  return s;
}

Status ParseMemoryCapRatio(std::string_view text, double* ratio) {
  double r = 0;
  if (!TypedNumberFlaw(text).empty() || !ParseDouble(text, &r) ||
      !(r > 0.0 && r <= 1.0)) {
    return Status::InvalidArgument(fmt::format(
        "memory cap ratio '{}' is not a number in (0, 1]{}; give -r "
        "(--memory_cap_ratio) a share of memory such as 0.5 (default 0.8), or "
        "--memory_cap_mb N for a size in MB",
        text, FlawNote(text)));
  }
  *ratio = r;
  return Status::OK();
}

Status ParseMemoryCapMb(std::string_view text, uint64_t* bytes) {
  long mb = 0;
  if (!ParseTyped(text, 1, 1L << 40, &mb)) {
    return Status::InvalidArgument(
        fmt::format("memory cap '{}' is not a positive number of MB{}: give a whole "
                    "number of MB, without a unit (--memory_cap_mb 4096 for 4 GB)",
                    text, FlawNote(text)));
  }
  *bytes = static_cast<uint64_t>(mb) << 20;
  return Status::OK();
}

Status ParseMetricsInterval(std::string_view text, int* seconds) {
  long n = 0;
  if (!ParseTyped(text, 1, 3600, &n)) {
    return Status::InvalidArgument(fmt::format(
        "metrics interval '{}' is not a number of seconds in 1..3600{}; give "
        "--metrics_interval a whole number of seconds in 1..3600, or leave it "
        "out for 5",
        text, FlawNote(text)));
  }
  *seconds = static_cast<int>(n);
  return Status::OK();
}

Status CheckAbsolutePath(std::string_view what, std::string_view path) {
  std::string_view flaw = TypedNumberFlaw(path);
  if (flaw == kSpaceAfter) {
    // A name may end in a space; given one, it is a quoting slip far more
    // often, and the directory it names is then "missing".
    return Status::InvalidArgument(
        fmt::format("{} '{}' ends in white space; give the path without it", what, path));
  }
  if (!path.empty() && path[0] == '/') return Status::OK();
  const bool said = path.empty() || flaw == kSpaceBefore;
  return Status::InvalidArgument(
      fmt::format("{} '{}' is not an absolute path{}; give one that starts with /", what,
                  path, said ? FlawNote(path) : ""));
}

Status CheckSpillDir(const std::string& dir) {
  Status s = CheckAbsolutePath("spill directory", dir);
  if (!s.ok()) return s;
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return Status::InvalidArgument("spill directory " + dir +
                                   " does not exist; create it first (mkdir -p)");
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("spill directory " + dir +
                                   " is not a directory; give -s a directory");
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status::InvalidArgument(
        "spill directory " + dir +
        " is not writable by this user; give -s a directory it "
        "can write");
  }
  return Status::OK();
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
  struct stat file;
  if (stat(path.c_str(), &file) == 0 && S_ISDIR(file.st_mode)) {
    return Status::InvalidArgument("metrics file " + path + " is a directory");
  }
  // Each rewrite goes through "<name>.tmp.XXXXXXXX" renamed over the file
  // (daemon/replace_file.h): that name must fit too.
  const size_t name_bytes = path.size() - slash - 1;
  if (name_bytes + kMetricsTempSuffixBytes > NAME_MAX) {
    return Status::InvalidArgument(fmt::format(
        "metrics file name has {} bytes; the server writes it through a temporary "
        "file of {} more, and a file name has at most {}: use a name of at most {} "
        "bytes",
        name_bytes, kMetricsTempSuffixBytes, NAME_MAX,
        NAME_MAX - kMetricsTempSuffixBytes));
  }
  // In a sticky directory (/tmp) nobody but its owner (or the directory's)
  // may replace a file: another user's file there would keep its values.
  if (stat(path.c_str(), &file) == 0 && (st.st_mode & S_ISVTX) && geteuid() != 0 &&
      file.st_uid != geteuid() && st.st_uid != geteuid()) {
    return Status::InvalidArgument(fmt::format(
        "metrics file {} belongs to uid {} in the sticky directory {}: this user "
        "cannot replace it; have it removed or give another path",
        path, file.st_uid, dir));
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
  constexpr uint64_t kMin = layout::kMinSegmentBytes;
  uint64_t cap = MemoryCapBytes(ratio, cap_bytes);
  if (cap >= kMin) return Status::OK();
  if (cap_bytes) {
    return Status::InvalidArgument(
        fmt::format("memory cap of {} MB is below one segment ({} MB); give "
                    "--memory_cap_mb {} or more",
                    cap_bytes >> 20, kMin >> 20, kMin >> 20));
  }
  return Status::InvalidArgument(
      fmt::format("memory cap ratio {} of {} MB of memory gives {} MB, below one segment "
                  "({} MB); use a larger -r",
                  ratio, PhysicalMemory() >> 20, cap >> 20, kMin >> 20));
}

int WorkerCount(int requested, int cpus, int nodes) {
  int workers = requested > 0 ? requested : std::max(1, cpus / 2);
  nodes = std::max(1, nodes);
  return (workers + nodes - 1) / nodes * nodes;
}

}  // namespace shmcache
