#include "daemon/daemon_options.h"

#include <vector>

#include "common/command_line.h"
#include "common/option_checks.h"
#include "format/instance.h"

namespace shmcache {
namespace {

// A daemon-only number: "<name> '<text>' is not a number in <lo>..<hi>".
template <typename T>
std::function<Status(const std::string&)> Number(const char* name, long lo, long hi,
                                                 T* out) {
  return [=](const std::string& v) {
    long n = 0;
    Status s = ParseInRange(name, v, lo, hi, &n);
    if (s.ok()) *out = static_cast<T>(n);
    return s;
  };
}

}  // namespace

Status ParseDaemonOptions(int argc, char** argv, DaemonOptions* o) {
  CommandLine cl("shmcached",
                 "start servers with 'shmcache --start' (see 'shmcache --help')");
  AddServerFlags(cl, o);
  cl.AddValue("--port", [o](const std::string& v) { return ParsePort(v, &o->port); });
  cl.AddValue("--run_dir", [o](const std::string& v) {
    o->run_dir = v;
    return Status::OK();
  });
  cl.AddValue("--ready_fd", Number("--ready_fd", 0, 1 << 20, &o->ready_fd));
  cl.AddValue("--watch_pid", Number("--watch_pid", 1, 1L << 30, &o->watch_pid));
  // Not in the admin CLI: for tests.
  cl.AddValue("--stall_timeout_ms",
              Number("--stall_timeout_ms", 1, 1L << 30, &o->stall_timeout_ms));
  uint64_t body_cap_mb = 0;
  cl.AddValue("--body_bytes_cap_mb",
              Number("--body_bytes_cap_mb", 1, 1L << 20, &body_cap_mb));
  CLI::Option* foreground = cl.AddFlag("--foreground");
  CLI::Option* version = cl.AddFlag("--version");
  Status s = cl.Parse(std::vector<std::string>(argv, argv + argc));
  if (!s.ok()) return s;
  if (version->count() > 0) {
    // Alone: with other options it would be unclear whether a server starts.
    if (argc > 2) {
      return Status::InvalidArgument(
          "--version takes no other option; give 'shmcached --version' alone");
    }
    o->version = true;
    return Status::OK();
  }
  o->foreground = foreground->count() > 0;
  if (body_cap_mb) o->body_bytes_cap = body_cap_mb << 20;
  return CheckServerFlags(*o);
}

}  // namespace shmcache
