#include "clients/admin/cli_args.h"

#include <utility>

#include <fmt/format.h>

#include "common/command_line.h"
#include "common/option_checks.h"
#include "format/instance.h"

namespace shmcache::admin {
namespace {

using CommandOption = std::pair<CLI::Option*, Command>;

// The commands, each a flag but -d, which takes the session id: read once
// the whole line is, as the commands its errors suggest need the port,
// which may come after it (*session_text).
std::vector<CommandOption> AddCommands(CommandLine& cl, std::string* session_text) {
  return {
      {cl.AddFlag("--start"), Command::kStart},
      {cl.AddFlag("--stop"), Command::kStop},
      {cl.AddFlag("-g,--generate_session"), Command::kGenerate},
      {cl.AddValue("-d,--destroy_session",
                   [session_text](const std::string& v) {
                     *session_text = v;
                     return Status::OK();
                   }),
       Command::kDestroy},
      {cl.AddFlag("--list_sessions"), Command::kList},
      {cl.AddFlag("--server_info"), Command::kInfo},
      {cl.AddFlag("--metrics"), Command::kMetrics},
      {cl.AddFlag("--help"), Command::kHelp},
      {cl.AddFlag("--version"), Command::kVersion},
  };
}

// The one command given, in *command.
Status TakeCommand(const CommandLine& cl, const std::vector<CommandOption>& commands,
                   Command* command) {
  for (const CLI::Option* given : cl.given()) {
    for (const auto& [option, c] : commands) {
      if (option != given) continue;
      if (*command != Command::kNone) {
        return Status::InvalidArgument(
            fmt::format("only one command per call: {} comes after another command",
                        cl.AsWritten(*option)));
      }
      *command = c;
    }
  }
  if (*command != Command::kNone) return Status::OK();
  return Status::InvalidArgument(
      "no command given; use one of --start, --stop, -g, -d ID, "
      "--list_sessions, --server_info, --metrics, --help, --version");
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
  --version                  print "shmcache VERSION" and exit

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
                             by --stop); the log says which pages it got.
                             Also taken by --stop: where a killed server
                             started with it left its files
  --log_dir DIR              where logs go, owner-only (default <run dir>/log:
                             /tmp/shmcache-<uid>/log or $SHMCACHE_RUN_DIR/log)
  --metrics_file PATH        rewrite --metrics output there every few seconds,
                             atomically (for node_exporter's textfile collector:
                             name it *.prom); removed when the server stops
  --metrics_interval S       seconds between rewrites of --metrics_file,
                             1..3600 (default 5)

Exit status: 0 on success, 1 with a one-line message on stderr otherwise.
)";
}

Status ParseCliArgs(const std::vector<std::string>& argv, CliArgs* a) {
  CommandLine cl("shmcache", "see 'shmcache --help'");
  std::string session_text;
  std::vector<CommandOption> commands = AddCommands(cl, &session_text);
  cl.AddValue("-h,--hostname", [a](const std::string& v) {
    // "" is the library's "not given" ($SHMCACHE_HOST or this host): given
    // on the line, it is a value lost (an unset variable in a script).
    if (v.empty()) {
      return Status::InvalidArgument(
          "host '' is empty; give -h (--hostname) 127.0.0.1, localhost or ::1, or "
          "leave it out for $SHMCACHE_HOST or 127.0.0.1");
    }
    a->hostname = v;
    return CheckHost(v);
  });
  cl.AddValue("-p,--port", [a](const std::string& v) { return ParsePort(v, &a->port); });
  CLI::Option* json = cl.AddFlag("--json");
  std::vector<CLI::Option*> start_only = AddServerFlags(cl, &a->server);
  Status s = cl.Parse(argv);
  if (s.ok()) s = TakeCommand(cl, commands, &a->command);
  if (s.ok() && a->command == Command::kDestroy) {
    s = ParseSessionId(session_text, a->port, &a->session_id);
  }
  if (!s.ok()) return s;
  a->json = json->count() > 0;
  if (a->json && a->command != Command::kList && a->command != Command::kInfo &&
      a->command != Command::kHelp) {
    return Status::InvalidArgument(
        "--json applies to --list_sessions and --server_info only (--metrics is "
        "Prometheus text)");
  }
  a->server_args = ServerFlagArgs(start_only);
  for (const CLI::Option* o : start_only) {
    // --shm_dir with --stop: where a server started with it left its files.
    if (o->count() > 0 && a->command != Command::kStart &&
        !(a->command == Command::kStop && o->get_name() == "--shm_dir")) {
      return Status::InvalidArgument(
          fmt::format("{} applies to --start only", cl.AsWritten(*o)));
    }
  }
  return Status::OK();
}

}  // namespace shmcache::admin
