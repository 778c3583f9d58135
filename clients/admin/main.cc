// shmcache: the admin command. Starts and stops the server, manages
// sessions, shows what is cached.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clients/admin/cli_args.h"
#include "clients/admin/output.h"
#include "clients/admin/start_server.h"
#include "clients/admin/stop_server.h"
#include "common/metrics.h"
#include "common/size_text.h"
#include "format/instance.h"
#include "format/shell_quote.h"
#include "shmcache/client.h"
#include "shmcache/version.h"

using namespace shmcache;
using namespace shmcache::admin;

namespace {

int Fail(const std::string& msg) {
  fmt::print(stderr, "shmcache: error: {}\n", msg);
  return 1;
}

// MindSpore's banner (started, process id, port, logs), saying what the
// port is here: no TCP port opens; clients reach the server through the
// Unix socket in the run dir and map its files in the shm dir, which the
// server names (it may have mounted a huge-page tmpfs of its own). What the
// server says it changed or found (a worker count raised to the NUMA
// nodes, caches it discarded) follows as warnings.
int RunStart(const CliArgs& a, const ClientOptions& co) {
  StartResult r;
  Status s = StartServer(a, co.port, &r);
  if (!s.ok()) return Fail(s.message());
  ServerInfo info;
  std::unique_ptr<Client> client;
  s = Client::Connect(co, &client);
  if (s.ok()) s = client->GetServerInfo(&info);
  const std::string shm_dir =
      s.ok() ? info.shm_dir
             : fmt::format("the directory 'shmcache --server_info{}' names",
                           PortArg(co.port));
  const InstancePaths paths = MakeInstancePaths(co.port, "", "");
  fmt::print(
      "Cache server startup completed successfully!\n"
      "The cache server daemon has been created as process id {} for port {}, which "
      "names the instance: no TCP port is opened.\n"
      "Clients connect through the Unix socket {} (run dir {}) and map shared memory in "
      "{}.\n"
      "Workers: {}. Logs: {}\n"
      "Stop it with 'shmcache --stop{}'.\n",
      r.pid, co.port, s.ok() ? info.socket_path : paths.socket_path, paths.run_dir,
      shm_dir, r.workers, r.log_path, PortArg(co.port));
  for (const std::string& note : r.notes) fmt::print("Warning: {}\n", note);
  return 0;
}

// The server's Prometheus text: its info and every cache's counters.
Status CollectMetrics(Client& client, std::string* out) {
  ServerInfo info;
  std::vector<SessionInfo> sessions;
  Status s = client.GetServerInfo(&info);
  if (s.ok()) s = client.ListSessions(&sessions);
  if (s.ok()) *out = PrometheusText(info, sessions);
  return s;
}

// What a server that ended without --stop left (r.left_*), and the
// commands that serve and then remove it.
std::string LeftFilesText(const StopResult& r, int port, const std::string& shm_dir) {
  return fmt::format(
      "one that ended without --stop left {} file{} ({}) in {}: {}'shmcache "
      "--start -p {}{}' serves them again, and --stop after it removes them",
      r.left_files, r.left_files == 1 ? "" : "s", SizeText(r.left_bytes), r.left_in,
      r.runs_elsewhere ? "once that one is stopped, " : "", port,
      shm_dir.empty() ? "" : " --shm_dir " + shm_dir);
}

int RunStop(const ClientOptions& co, int port, const std::string& shm_dir) {
  StopResult r;
  Status s = StopServer(co, shm_dir, &r);
  if (!s.ok()) return Fail(s.message());
  if (r.not_running) {
    // An error, as MindSpore's cache_admin --stop gives one ("not up or has
    // been shutdown already"): a script that stops a server it believes
    // running learns that it was not. Cleanup scripts write `|| true`.
    // Said as a stop finds it, not with the hint to start one.
    std::string msg =
        fmt::format("no cache server is running on port {}; nothing to stop", port);
    if (r.runs_elsewhere) {
      msg = fmt::format(
          "no cache server is running on port {} with run dir {}; nothing to stop. A "
          "server of yours on port {} ",
          port, r.run_dir, port);
      // Its run dir is written just after it takes the host lock: until
      // then there is no command to give.
      if (r.other_run_dir.empty()) {
        msg +=
            "is starting with another run dir (it has not written which yet): try "
            "again in a moment";
      } else {
        msg += fmt::format(
            "runs with run dir {} (process id {}): stop it with "
            "'SHMCACHE_RUN_DIR={} shmcache --stop -p {}'",
            r.other_run_dir, r.other_pid > 0 ? std::to_string(r.other_pid) : "?",
            ShellQuote(r.other_run_dir), port);
      }
      if (r.left_files > 0) msg += "; " + LeftFilesText(r, port, shm_dir);
    } else if (r.left_files > 0) {
      msg += ", but " + LeftFilesText(r, port, shm_dir);
    }
    return Fail(msg);
  }
  if (r.was_suspended) {
    fmt::print(
        "Cache server on port {} (process id {}) was stopped (SIGSTOP, Ctrl-Z or a "
        "debugger) and answered nothing; it has been resumed and stopped.\n",
        port, r.pid);
  } else if (r.was_starting) {
    fmt::print(
        "Cache server on port {} (process id {}) was still starting (not "
        "answering yet); it has been stopped.\n",
        port, r.pid);
  } else if (!r.socket_lost.empty()) {
    fmt::print(
        "Cache server on port {} (process id {}) has been stopped; its socket {} "
        "had been {}.\n",
        port, r.pid, r.socket_path, r.socket_lost);
  } else if (r.run_files_gone) {
    fmt::print(
        "Cache server on port {} (process id {}) has been stopped; its socket and lock "
        "file in {} had been removed.\n",
        port, r.pid, r.run_dir);
  } else {
    fmt::print("Cache server on port {} has been stopped.\n", port);
  }
  return 0;
}

// The command as written again, without -p: for a message that says how
// to run it against another server.
std::string CommandText(const CliArgs& a) {
  const char* json = a.json ? " --json" : "";
  switch (a.command) {
    case Command::kGenerate: return "-g";
    case Command::kDestroy: return fmt::format("-d {}", a.session_id);
    case Command::kList: return fmt::format("--list_sessions{}", json);
    case Command::kInfo: return fmt::format("--server_info{}", json);
    case Command::kMetrics: return "--metrics";
    default: return "--help";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  CliArgs a;
  Status s = ParseCliArgs(args, &a);
  if (!s.ok()) return Fail(s.message());
  if (a.command == Command::kHelp) {
    fmt::print("{}", UsageText());
    return 0;
  }
  if (a.command == Command::kVersion) {
    fmt::print("shmcache {}\n", VersionText());
    return 0;
  }
  s = CheckHost(a.hostname);
  if (!s.ok()) return Fail(s.message());
  int port;
  s = ResolvePort(a.port, &port);
  if (!s.ok()) return Fail(s.message());
  ClientOptions co;
  co.port = port;
  co.hostname = a.hostname;
  if (a.command == Command::kStart) return RunStart(a, co);
  if (a.command == Command::kStop) return RunStop(co, port, a.server.shm_dir);
  // A connect that fails names a server of the port running elsewhere, with
  // this command as the one that reaches it: the host lock is read once.
  co.admin_command = CommandText(a);
  std::unique_ptr<Client> client;
  s = Client::Connect(co, &client);
  if (!s.ok()) return Fail(s.message());

  switch (a.command) {
    case Command::kGenerate: {
      uint32_t id;
      s = client->CreateSession(&id);
      if (!s.ok()) return Fail(s.message());
      fmt::print("Session created for server on port {}: {}\n", port, id);
      return 0;
    }
    case Command::kDestroy: {
      s = client->DestroySession(a.session_id);
      if (!s.ok()) return Fail(s.message());
      fmt::print("Drop session successfully for server on port {}: {}\n", port,
                 a.session_id);
      return 0;
    }
    case Command::kList: {
      std::vector<SessionInfo> sessions;
      s = client->ListSessions(&sessions);
      if (!s.ok()) return Fail(s.message());
      fmt::print("{}", a.json ? SessionsJson(sessions) : SessionsTable(port, sessions));
      return 0;
    }
    case Command::kInfo: {
      ServerInfo info;
      s = client->GetServerInfo(&info);
      if (!s.ok()) return Fail(s.message());
      fmt::print("{}", a.json ? ServerInfoJson(info) : ServerInfoTable(info));
      return 0;
    }
    case Command::kMetrics: {
      std::string text;
      s = CollectMetrics(*client, &text);
      if (!s.ok()) return Fail(s.message());
      // Megabytes with many caches: written as is, not copied by a format.
      std::fwrite(text.data(), 1, text.size(), stdout);
      return 0;
    }
    default: return Fail("unhandled command");
  }
}
