#include "format/instance.h"

#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "format/owned_dir.h"
#include "format/parse_number.h"
#include "shmcache/options.h"

namespace shmcache {

std::string InstancePaths::CacheFile(uint32_t cache_id) const {
  return fmt::format("{}cache.{}", shm_prefix, cache_id);
}
std::string InstancePaths::TableFile(uint32_t cache_id, uint32_t gen,
                                     uint32_t tag) const {
  return fmt::format("{}table.{}.{}.{:08x}", shm_prefix, cache_id, gen, tag);
}
std::string InstancePaths::SegmentFile(uint32_t cache_id, uint32_t seg_no) const {
  return fmt::format("{}seg.{}.{}", shm_prefix, cache_id, seg_no);
}
std::string InstancePaths::SessionsFile() const { return shm_prefix + "sessions"; }
std::string InstancePaths::SpillRecordFile() const { return shm_prefix + "spilldb"; }
std::string InstancePaths::StageFile(uint32_t cache_id, uint32_t tag) const {
  return fmt::format("{}stage.{}.{:08x}", shm_prefix, cache_id, tag);
}

namespace {

// Takes "<prefix>" off the front of *s.
bool Skip(std::string_view* s, std::string_view prefix) {
  if (s->substr(0, prefix.size()) != prefix) return false;
  s->remove_prefix(prefix.size());
  return true;
}

// Takes a decimal uint32 as fmt writes it (no sign, no leading zero) off
// the front of *s.
bool TakeNumber(std::string_view* s, uint32_t* out) {
  size_t n = 0;
  uint64_t v = 0;
  while (n < s->size() && (*s)[n] >= '0' && (*s)[n] <= '9' && n < 11) {
    v = v * 10 + static_cast<uint64_t>((*s)[n] - '0');
    ++n;
  }
  if (n == 0 || (n > 1 && (*s)[0] == '0') || v > UINT32_MAX) return false;
  *out = static_cast<uint32_t>(v);
  s->remove_prefix(n);
  return true;
}

// Takes exactly 8 lowercase hex digits off the front of *s.
bool TakeTag(std::string_view* s, uint32_t* out) {
  if (s->size() < 8) return false;
  uint32_t v = 0;
  for (size_t i = 0; i < 8; ++i) {
    char c = (*s)[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | static_cast<uint32_t>(d);
  }
  *out = v;
  s->remove_prefix(8);
  return true;
}

// "<kind>.<first>[.<second>][.<tag>]", exactly.
bool Matches(std::string_view s, std::string_view kind, uint32_t* first, uint32_t* second,
             uint32_t* tag) {
  if (!Skip(&s, kind) || !Skip(&s, ".") || !TakeNumber(&s, first)) return false;
  if (second != nullptr && !(Skip(&s, ".") && TakeNumber(&s, second))) return false;
  if (tag != nullptr && !(Skip(&s, ".") && TakeTag(&s, tag))) return false;
  return s.empty();
}

}  // namespace

ShmName ParseShmName(std::string_view rest) {
  using Kind = ShmName::Kind;
  ShmName n;
  if (rest == "sessions") {
    n.kind = Kind::kSessions;
  } else if (rest == "spilldb") {
    n.kind = Kind::kSpillRecord;
  } else if (rest == "huge") {
    n.kind = Kind::kHugeDir;
  } else if (Matches(rest, "cache", &n.cache_id, nullptr, nullptr)) {
    n.kind = Kind::kCache;
  } else if (Matches(rest, "table", &n.cache_id, &n.number, &n.tag)) {
    n.kind = Kind::kTable;
  } else if (Matches(rest, "seg", &n.cache_id, &n.number, nullptr)) {
    n.kind = Kind::kSegment;
  } else if (Matches(rest, "stage", &n.cache_id, nullptr, &n.tag)) {
    n.kind = Kind::kStage;
  } else {
    n = ShmName{};
  }
  return n;
}

Status ParsePort(const std::string& text, int* port) {
  long v = 0;
  // As typed: digits alone (' 5000' hid a quoting slip), without a leading
  // zero: the port is in file names as written without one, and other tools
  // (a shell's $((050921)), strtol base 0) read "0..." as octal.
  std::string_view flaw = TypedNumberFlaw(text);
  if (flaw.empty() && text.size() > 1 && text[0] == '0') flaw = "a leading zero";
  if (!flaw.empty() || !ParseDecimal(text, kMinPort, kMaxPort, &v)) {
    return Status::InvalidArgument(
        fmt::format("port '{}' is not a number in {}..{}{}; use a whole number in that "
                    "range, such as the default {} (it names the instance: no TCP port "
                    "is opened)",
                    text, kMinPort, kMaxPort,
                    flaw.empty() ? "" : fmt::format(" ({})", flaw), kDefaultPort));
  }
  *port = static_cast<int>(v);
  return Status::OK();
}

std::string PortArg(int port) {
  return port == 0 || port == kDefaultPort ? "" : fmt::format(" -p {}", port);
}

Status ResolvePort(int requested, int* port) {
  if (requested != 0) {
    if (requested < kMinPort || requested > kMaxPort) {
      return Status::InvalidArgument(
          fmt::format("port {} is outside {}..{}; use a port in that range, such as "
                      "the default {}",
                      requested, kMinPort, kMaxPort, kDefaultPort));
    }
    *port = requested;
    return Status::OK();
  }
  // Set is given, even empty: an empty value is refused as `-p ''` is
  // (an unset variable in a script), not read as the default.
  const char* env = std::getenv("SHMCACHE_PORT");
  if (env != nullptr) {
    Status s = ParsePort(env, port);
    if (!s.ok()) {
      return Status::InvalidArgument("SHMCACHE_PORT: " + s.message() +
                                     "; or unset SHMCACHE_PORT for the default");
    }
    return s;
  }
  *port = kDefaultPort;
  return Status::OK();
}

Status CheckHost(const std::string& host) {
  std::string h = host;
  const char* from = "";
  if (h.empty()) {
    const char* env = std::getenv("SHMCACHE_HOST");
    if (env != nullptr && *env == '\0') {
      // As `-h ''` is: a value lost, not "this host".
      return Status::InvalidArgument(
          "SHMCACHE_HOST: host '' is empty; set it to 127.0.0.1, localhost or ::1, or "
          "unset it for 127.0.0.1");
    }
    if (env != nullptr) h = env;
    from = "SHMCACHE_HOST: ";  // as ResolvePort names SHMCACHE_PORT
  }
  auto local = [](std::string_view name) {
    return name == "127.0.0.1" || name == "localhost" || name == "::1";
  };
  if (h.empty() || local(h)) return Status::OK();
  const size_t first = h.find_first_not_of(" \t\n\r\f\v");
  const size_t last = h.find_last_not_of(" \t\n\r\f\v");
  if (first != std::string::npos &&
      local(std::string_view(h).substr(first, last - first + 1))) {
    return Status::InvalidArgument(
        fmt::format("{}host '{}' has white space around the name; give '{}' alone", from,
                    h, h.substr(first, last - first + 1)));
  }
  return Status::InvalidArgument(
      fmt::format("{}host '{}' is not this machine: shmcache serves the local host only "
                  "(use 127.0.0.1, localhost or ::1)",
                  from, h));
}

// A variable set but empty is returned as "", which CheckRunDir and
// CheckShmDirFromEnv refuse: as an empty --shm_dir or SHMCACHE_PORT is,
// and not as unset, which sent a job meant to have a directory of its own
// to the shared default.
std::string DefaultRunDir() {
  const char* env = std::getenv("SHMCACHE_RUN_DIR");
  if (env != nullptr) return env;
  return fmt::format("/tmp/shmcache-{}", geteuid());
}

std::string DefaultShmDir() {
  const char* env = std::getenv("SHMCACHE_SHM_DIR");
  if (env != nullptr) return env;
  return "/dev/shm";
}

std::string HugeShmDir(int port) {
  return fmt::format("/dev/shm/shmcache.{}.{}.huge", geteuid(), port);
}

std::string HostLockPath(int port) {
  return fmt::format("/dev/shm/.shmcache.{}.{}.lock", geteuid(), port);
}

InstancePaths MakeInstancePaths(int port, const std::string& run_dir,
                                const std::string& shm_dir) {
  InstancePaths p;
  p.port = port;
  p.run_dir = run_dir.empty() ? DefaultRunDir() : run_dir;
  p.shm_dir = shm_dir.empty() ? DefaultShmDir() : shm_dir;
  p.socket_path = fmt::format("{}/shmcached-{}.sock", p.run_dir, port);
  p.lock_path = fmt::format("{}/shmcached-{}.lock", p.run_dir, port);
  p.shm_prefix = fmt::format("{}/shmcache.{}.{}.", p.shm_dir, geteuid(), port);
  return p;
}

Status CheckSocketPath(const std::string& socket_path) {
  constexpr size_t kMax = sizeof(sockaddr_un::sun_path) - 1;  // and a NUL
  if (socket_path.size() <= kMax) return Status::OK();
  return Status::InvalidArgument(fmt::format(
      "socket path {} is {} bytes, longer than the {} the system allows; use a "
      "shorter SHMCACHE_RUN_DIR",
      socket_path, socket_path.size(), kMax));
}

namespace {

// InvalidArgument unless `dir` (from `var` or an option) is absolute and
// ends in no white space, saying why it must be and what `var` falls back
// to unset.
Status AbsoluteDir(std::string_view what, std::string_view var, const std::string& dir,
                   std::string_view why, std::string_view fallback) {
  // White space around it, as a flag's value (CheckAbsolutePath): a quoting
  // slip far more often than a name, and unseen in any later message.
  const std::string_view flaw = TypedNumberFlaw(dir);
  if (flaw == kSpaceAfter) {
    return Status::InvalidArgument(
        fmt::format("{} '{}' ({}) ends in white space; set {} to the path without it, "
                    "or unset it for {}",
                    what, dir, var, var, fallback));
  }
  if (!dir.empty() && dir[0] == '/') return Status::OK();
  if (dir.empty() || flaw == kSpaceBefore) {
    return Status::InvalidArgument(
        fmt::format("{} '{}' ({}) is not an absolute path ({}); set {} to an absolute "
                    "directory, or unset it for {}",
                    what, dir, var, flaw, var, fallback));
  }
  return Status::InvalidArgument(fmt::format(
      "{} '{}' ({}) is not an absolute path: {}; set {} to an absolute directory, or "
      "unset it for {}",
      what, dir, var, why, var, fallback));
}

}  // namespace

Status CheckRunDir(const std::string& run_dir) {
  return AbsoluteDir("run dir", "SHMCACHE_RUN_DIR", run_dir,
                     "the server's socket there would be found only from the directory "
                     "it was started in",
                     fmt::format("/tmp/shmcache-{}", geteuid()));
}

Status CheckShmDirFromEnv(const std::string& shm_dir) {
  return AbsoluteDir("shared-memory directory", "SHMCACHE_SHM_DIR", shm_dir,
                     "clients in other directories would not find the cache's files",
                     "/dev/shm");
}

static Status OpenRunDir(const std::string& dir, bool create) {
  int fd = -1;
  Status s =
      OpenOwnedDir(dir, create,
                   "remove it (as its owner or root), or set SHMCACHE_RUN_DIR to a "
                   "directory of your own, mode 0700",
                   &fd);
  if (s.ok()) close(fd);
  return s;
}

Status EnsureRunDir(const std::string& dir) { return OpenRunDir(dir, /*create=*/true); }

Status CheckOwnRunDir(const std::string& dir) {
  Status s = OpenRunDir(dir, /*create=*/false);
  return s.IsNotFound() ? Status::OK() : s;
}

}  // namespace shmcache
