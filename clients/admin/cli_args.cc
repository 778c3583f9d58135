#include "cli_args.h"

#include <cerrno>
#include <cstdlib>
#include <fmt/format.h>
#include <string_view>

#include "daemon_options.h"
#include "instance.h"
#include "parse_number.h"

namespace shmcache::admin {
namespace {

struct OptionSpec {
  const char* short_name;  // "" when none
  const char* long_name;
  bool takes_value;
  bool start_only;
};

constexpr OptionSpec kOptions[] = {
    {"", "start", false, false},
    {"", "stop", false, false},
    {"-g", "generate_session", false, false},
    {"-d", "destroy_session", true, false},
    {"", "list_sessions", false, false},
    {"", "server_info", false, false},
    {"", "metrics", false, false},
    {"", "help", false, false},
    {"-h", "hostname", true, false},
    {"-p", "port", true, false},
    {"-w", "workers", true, true},
    {"-s", "spilldir", true, true},
    {"-l", "loglevel", true, true},
    {"-r", "memory_cap_ratio", true, true},
    {"", "memory_cap_mb", true, true},
    {"", "shm_dir", true, true},
    {"", "log_dir", true, true},
    {"", "json", false, false},
    {"", "metrics_file", true, true},
    {"", "metrics_interval", true, true},
};

Status SetCommand(CliArgs* a, Command c, const std::string& flag) {
  if (a->command != Command::kNone) {
    return Status::InvalidArgument(fmt::format(
        "only one command per call: {} comes after another command", flag));
  }
  a->command = c;
  return Status::OK();
}

}  // namespace

const char* UsageText() {
  return R"(Usage: shmcache COMMAND [OPTIONS]

Commands (one per call):
  --start                    start the cache server (detaches; prints where it logs)
  --stop                     stop the server, removing its shared memory
  -g, --generate_session     create a session; its id is the last token printed
  -d, --destroy_session ID   drop a session, its caches and their memory
  --list_sessions            sessions and caches with their statistics
  --server_info              the server's configuration and sessions
  --metrics                  Prometheus text exposition of the server and its caches
  --help                     this text

Options:
  -h, --hostname HOST        this host only: 127.0.0.1 (default), localhost, ::1
                             (env SHMCACHE_HOST)
  -p, --port PORT            instance to talk to, 1025..65535 (default 50052,
                             env SHMCACHE_PORT); names the socket, opens no TCP port
  --json                     machine-readable output (--list_sessions, --server_info)

Options of --start:
  -w, --workers N            worker threads, 1..512 (default half the CPUs),
                             rounded up to a multiple of the NUMA nodes
  -s, --spilldir DIR         absolute, writable directory for spilled rows
  -l, --loglevel L           0 debug, 1 info (default), 2 warning, 3 error, 4 fatal
  -r, --memory_cap_ratio R   share of physical memory all caches may use, (0,1]
                             (default 0.8)
  --memory_cap_mb N          absolute memory cap in MB (overrides -r)
  --shm_dir DIR              where segments live (default /dev/shm, env
                             SHMCACHE_SHM_DIR). With SHMCACHE_HUGE_TMPFS=1
                             and as root, a huge-page tmpfs the server mounts
                             at /dev/shm/shmcache.<uid>.<port>.huge (unmounted
                             by --stop); the log says which pages it got
  --log_dir DIR              where logs go, owner-only (default <run dir>/log:
                             /tmp/shmcache-<uid>/log or $SHMCACHE_RUN_DIR/log)
  --metrics_file PATH        rewrite --metrics output there every few seconds,
                             atomically (for node_exporter's textfile collector:
                             name it *.prom); removed when the server stops
  --metrics_interval S       seconds between rewrites, 1..3600 (default 5)

Exit status: 0 on success, 1 with a one-line message on stderr otherwise.
)";
}

Status ParseCliArgs(const std::vector<std::string>& argv, CliArgs* a) {
  bool saw_start_option = false;
  std::string start_option;
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0) {
      auto eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_inline = true;
      }
    }
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& o : kOptions) {
      if (arg == std::string("--") + o.long_name ||
          (o.short_name[0] != '\0' && arg == o.short_name)) {
        spec = &o;
        break;
      }
    }
    if (spec == nullptr) {
      if (arg.empty() || arg[0] != '-') {
        return Status::InvalidArgument(fmt::format(
            "unexpected argument '{}'; see 'shmcache --help'", arg));
      }
      return Status::InvalidArgument(
          fmt::format("unknown option '{}'; see 'shmcache --help'", arg));
    }
    std::string flag = arg;
    if (spec->takes_value && !has_inline) {
      if (i + 1 >= argv.size()) {
        return Status::InvalidArgument(fmt::format("{} needs a value", flag));
      }
      value = argv[++i];
    } else if (!spec->takes_value && has_inline) {
      return Status::InvalidArgument(fmt::format("{} takes no value", flag));
    }
    if (spec->start_only) {
      saw_start_option = true;
      start_option = flag;
    }
    std::string_view name = spec->long_name;
    long n = 0;
    Status s;
    if (name == "start") s = SetCommand(a, Command::kStart, flag);
    else if (name == "stop") s = SetCommand(a, Command::kStop, flag);
    else if (name == "generate_session") s = SetCommand(a, Command::kGenerate, flag);
    else if (name == "list_sessions") s = SetCommand(a, Command::kList, flag);
    else if (name == "server_info") s = SetCommand(a, Command::kInfo, flag);
    else if (name == "metrics") s = SetCommand(a, Command::kMetrics, flag);
    else if (name == "help") s = SetCommand(a, Command::kHelp, flag);
    else if (name == "destroy_session") {
      s = SetCommand(a, Command::kDestroy, flag);
      if (s.ok() && !ParseDecimal(value, 0, 4294967295L, &n)) {
        return Status::InvalidArgument(fmt::format(
            "session id '{}' is not a number in 0..4294967295", value));
      }
      a->session_id = static_cast<uint32_t>(n);
    } else if (name == "hostname") {
      s = CheckHost(value);
      a->hostname = value;
    } else if (name == "port") {
      s = ParsePort(value, &a->port);
    } else if (name == "workers") {
      if (!ParseDecimal(value, 1, 512, &n)) {
        return Status::InvalidArgument(fmt::format(
            "worker count '{}' is not a number in 1..512", value));
      }
      a->workers = static_cast<int>(n);
    } else if (name == "loglevel") {
      if (!ParseDecimal(value, 0, 4, &n)) {
        return Status::InvalidArgument(
            fmt::format("log level '{}' is not a number in 0..4", value));
      }
      a->log_level = static_cast<int>(n);
    } else if (name == "spilldir") {
      a->spill_dir = value;
    } else if (name == "memory_cap_ratio") {
      char* end = nullptr;
      double r = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(r > 0.0 && r <= 1.0)) {
        return Status::InvalidArgument(fmt::format(
            "memory cap ratio '{}' is not a number in (0, 1]", value));
      }
      a->memory_cap_ratio = r;
    } else if (name == "memory_cap_mb") {
      if (!ParseDecimal(value, 1, 1L << 40, &n)) {
        return Status::InvalidArgument(fmt::format(
            "memory cap '{}' is not a positive number of MB", value));
      }
      a->memory_cap_mb = static_cast<uint64_t>(n);
    } else if (name == "shm_dir") {
      if (value.empty() || value[0] != '/') {
        return Status::InvalidArgument(fmt::format(
            "shared-memory directory '{}' is not an absolute path", value));
      }
      a->shm_dir = value;
    } else if (name == "log_dir") {
      if (value.empty() || value[0] != '/') {
        return Status::InvalidArgument(
            fmt::format("log directory '{}' is not an absolute path", value));
      }
      a->log_dir = value;
    } else if (name == "json") {
      a->json = true;
    } else if (name == "metrics_file") {
      if (value.empty() || value[0] != '/') {
        return Status::InvalidArgument(
            fmt::format("metrics file '{}' is not an absolute path", value));
      }
      a->metrics_file = value;
    } else if (name == "metrics_interval") {
      if (!ParseDecimal(value, 1, 3600, &n)) {
        return Status::InvalidArgument(fmt::format(
            "metrics interval '{}' is not a number of seconds in 1..3600", value));
      }
      a->metrics_interval = static_cast<int>(n);
    }
    if (!s.ok()) return Status::InvalidArgument(s.message());
  }
  if (a->command == Command::kNone) {
    return Status::InvalidArgument(
        "no command given; use one of --start, --stop, -g, -d ID, "
        "--list_sessions, --server_info, --metrics, --help");
  }
  if (saw_start_option && a->command != Command::kStart) {
    return Status::InvalidArgument(
        fmt::format("{} applies to --start only", start_option));
  }
  if (a->command == Command::kStart) {
    double ratio = a->memory_cap_ratio > 0 ? a->memory_cap_ratio
                                           : DaemonOptions{}.memory_cap_ratio;
    return CheckMemoryCap(ratio, a->memory_cap_mb << 20);
  }
  return Status::OK();
}

}  // namespace shmcache::admin
