// The admin CLI, run as a program: every command, every class of invalid
// argument (exit code 1 and a one-line message naming the problem), JSON
// output, and two instances side by side.
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "format/instance.h"
#include "format/owned_dir.h"
#include "tests/support/child_process.h"
#include "tests/support/test_server.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {
namespace {

using Json = nlohmann::json;

// Runs the admin with args and no server-specific environment except a
// private run dir, so that nothing reaches a real server.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override { run_dir_ = MakeTempDir(TestTmpRoot(), "cli"); }
  void TearDown() override { RemoveTree(run_dir_); }

  CommandResult Run(std::vector<std::string> args, Env env = {}) {
    std::vector<std::string> argv = {AdminPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    env.emplace_back("SHMCACHE_RUN_DIR", run_dir_);
    return RunCommand(argv, env);
  }
  // Exit code 1, nothing on stdout, one line on stderr containing `what`.
  void ExpectError(const std::vector<std::string>& args, const std::string& what,
                   Env env = {}) {
    CommandResult r = Run(args, std::move(env));
    SCOPED_TRACE(testing::PrintToString(args));
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_NE(r.err.find(what), std::string::npos)
        << "message should name '" << what << "'\n"
        << r.Describe();
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("shmcache: error: ", 0), 0u) << r.err;
  }

  // --stop in this run dir, on the port of `server` (which runs under its
  // own run dir): it fails and leaves `server`'s files; returned is what it
  // says after "A server of yours on port N ".
  std::string StopFromAnotherRunDir(const TestServer& server) {
    const std::string port = std::to_string(server.port());
    CommandResult r = Run({"--stop", "-p", port, "--shm_dir", server.shm_dir()});
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_FALSE(server.ShmFiles().empty()) << "the running server keeps its files";
    const std::string head = fmt::format(
        "shmcache: error: no cache server is running on port {} with run dir {}; "
        "nothing to stop. A server of yours on port {} ",
        port, run_dir_, port);
    if (r.err.rfind(head, 0) != 0) return r.err;
    return r.err.substr(head.size());
  }

  std::string run_dir_;
};

Json ParseJson(const std::string& text) {
  return Json::parse(text);  // throws on malformed JSON
}

std::string LastToken(const std::string& out) {
  std::istringstream in(out);
  std::string tok, last;
  while (in >> tok) last = tok;
  return last;
}

TEST_F(CliTest, HelpListsEveryCommand) {
  CommandResult r = Run({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  for (const char* c :
       {"--start", "--stop", "--generate_session", "--destroy_session", "--list_sessions",
        "--server_info", "--json", "--port", "--hostname", "--workers", "--spilldir",
        "--loglevel", "--metrics", "--metrics_file", "--metrics_interval"}) {
    EXPECT_NE(r.out.find(c), std::string::npos) << c;
  }
}

// --version prints "<program> <meson's project version>" and exits 0, as
// any CLI does; for the admin it is a command like --help (one per call),
// the daemon takes it alone and starts nothing.
TEST_F(CliTest, VersionPrintsTheProjectVersion) {
  const char* version = std::getenv("SHMCACHE_PROJECT_VERSION");
  ASSERT_NE(version, nullptr) << "run through meson test";
  CommandResult r = Run({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out, fmt::format("shmcache {}\n", version)) << r.Describe();
  EXPECT_EQ(r.err, "");
  r = Run({"--version", "-p", "31009"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  ExpectError({"--version", "--list_sessions"}, "only one command per call");
  ExpectError({"--version", "--json"}, "--json applies to");
  r = RunCommand({DaemonPath(), "--version"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out, fmt::format("shmcached {}\n", version)) << r.Describe();
  r = RunCommand({DaemonPath(), "--version", "--run_dir=" + run_dir_ + "/never"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("--version takes no other option"), std::string::npos)
      << r.Describe();
  EXPECT_FALSE(PathExists(run_dir_ + "/never"));
}

TEST_F(CliTest, NoCommand) { ExpectError({}, "no command given"); }

TEST_F(CliTest, UnknownOption) {
  ExpectError({"--list_sessions", "--bogus"}, "unknown option '--bogus'");
  ExpectError({"-x"}, "unknown option '-x'");
  ExpectError({"--list_sessions", "stray"}, "unexpected argument 'stray'");
}

TEST_F(CliTest, MissingValue) {
  ExpectError({"--list_sessions", "-p"},
              "-p (--port) needs a value; see 'shmcache --help'");
  ExpectError({"-d"}, "-d (--destroy_session) needs a value");
  ExpectError({"--start", "-w"}, "-w (--workers) needs a value");
  ExpectError({"--start", "--spilldir"},
              "--spilldir needs a value; see 'shmcache --help'");
  // -h is the host (as in MindSpore's cache_admin), not help: say so.
  ExpectError({"-h"}, "-h (--hostname) needs a value; see 'shmcache --help'");
  ExpectError({"--list_sessions", "--json=yes"}, "--json takes no value");
}

TEST_F(CliTest, NonNumericOrOutOfRangeNumbers) {
  ExpectError({"--list_sessions", "-p", "abc"}, "port 'abc'");
  ExpectError({"--list_sessions", "-p", "12x"}, "port '12x'");
  // Each says what a session id is and where to find one; no server needed.
  // (An empty one, and white space: ValuesAreTakenAsTyped.)
  for (const char* id : {"xyz", "-5", "4294967296", "99999999999999999999", "12x"}) {
    ExpectError({"-d", id},
                fmt::format("session id '{}' is not a number in 1..4294967295, "
                            "as 'shmcache -g' prints; list the sessions with "
                            "'shmcache --list_sessions'",
                            id));
  }
  ExpectError({"--start", "-l", "9"},
              "log level '9' is not a number in 0..4; give -l (--loglevel) 0 (debug), 1 "
              "(info, the default), 2 (warning), 3 (error) or 4 (fatal)");
  ExpectError({"--start", "-l", "info"}, "log level 'info'");
  ExpectError({"--start", "-r", "1.5"},
              "memory cap ratio '1.5' is not a number in (0, 1]; give -r "
              "(--memory_cap_ratio) a share of memory such as 0.5 (default 0.8), or "
              "--memory_cap_mb N for a size in MB");
  ExpectError({"--start", "--memory_cap_mb", "0"}, "memory cap '0'");
  // A size with a unit: the message says how to write it.
  ExpectError({"--start", "--memory_cap_mb", "4G"},
              "memory cap '4G' is not a positive number of MB: give a whole number of "
              "MB, without a unit (--memory_cap_mb 4096 for 4 GB)");
}

// Every value of the admin as it was typed: an empty one, white space
// around it (a quoting slip: `-d " 12"` was session 12, `-h ""` the
// default host), a '+' sign, a short option written with '=' ("-p=5000"
// was the value "=5000"): refused with what was wrong and what to give.
TEST_F(CliTest, ValuesAreTakenAsTyped) {
  struct Case {
    std::vector<std::string> args;
    std::string what;
  };
  const std::string workers_fix = "; give -w (--workers) a whole number of threads";
  const std::vector<Case> cases = {
      {{"-d", " 12"},
       "session id ' 12' is not a number in 1..4294967295 (white space before it), as "
       "'shmcache -g' prints"},
      {{"-d", "12 "},
       "session id '12 ' is not a number in 1..4294967295 (white space "
       "after it)"},
      {{"-d", "+12"}, "session id '+12' is not a number in 1..4294967295 (a '+' sign)"},
      {{"-d", ""}, "session id '' is not a number in 1..4294967295 (it is empty)"},
      {{"-d", "\t12"}, "(white space before it)"},
      {{"-g", "-p", " 5000"},
       "port ' 5000' is not a number in 1025..65535 (white space before it); use a "
       "whole number"},
      {{"-g", "--port=+5000"},
       "port '+5000' is not a number in 1025..65535 (a '+' sign)"},
      {{"-g", "-p", ""}, "port '' is not a number in 1025..65535 (it is empty)"},
      {{"-g", "-h", ""},
       "host '' is empty; give -h (--hostname) 127.0.0.1, localhost or ::1, or leave it "
       "out"},
      {{"-g", "-h", " localhost"},
       "host ' localhost' has white space around the name; give 'localhost' alone"},
      {{"-g", "--hostname", "::1 "}, "host '::1 ' has white space around the name"},
      {{"--start", "-w", " 3"},
       "worker count ' 3' is not a number in 1..512 (white space before it)" +
           workers_fix},
      {{"--start", "-w", "+3"},
       "worker count '+3' is not a number in 1..512 (a '+' sign)"},
      {{"--start", "--workers", "3 "}, "(white space after it)" + workers_fix},
      {{"--start", "-l", " 1"},
       "log level ' 1' is not a number in 0..4 (white space "
       "before it); give -l (--loglevel)"},
      {{"--start", "-r", " 0.5"},
       "memory cap ratio ' 0.5' is not a number in (0, 1] (white space before it); give "
       "-r"},
      {{"--start", "-r", "+0.5"},
       "memory cap ratio '+0.5' is not a number in (0, 1] (a "
       "'+' sign)"},
      {{"--start", "--memory_cap_mb", " 100"},
       "memory cap ' 100' is not a positive number of MB (white space before it): give "
       "a whole number of MB"},
      {{"--start", "--memory_cap_mb", "+100"}, "(a '+' sign)"},
      {{"--start", "--memory_cap_mb", ""},
       "memory cap '' is not a positive number of MB "
       "(it is empty)"},
      {{"--start", "--metrics_file", "/tmp/m.prom", "--metrics_interval", "5 "},
       "metrics interval '5 ' is not a number of seconds in 1..3600 (white space after "
       "it); give --metrics_interval"},
      {{"--start", "-s", "/tmp "},
       "spill directory '/tmp ' ends in white space; give the path without it"},
      {{"--start", "-s", " /tmp"},
       "spill directory ' /tmp' is not an absolute path (white space before it); give "
       "one that starts with /"},
      {{"--start", "-s", ""}, "spill directory '' is not an absolute path (it is empty)"},
      {{"--stop", "--shm_dir", "/dev/shm "},
       "shared-memory directory '/dev/shm ' ends in white space"},
      {{"--start", "--log_dir", "/tmp/log\t"},
       "log directory '/tmp/log\t' ends in white "
       "space"},
      {{"--start", "--metrics_file", "/tmp/m.prom "},
       "metrics file '/tmp/m.prom ' ends "
       "in white space"},
      {{"-g", "-p=5000"},
       "-p=5000: a short option takes its value after a space; write '-p 5000' or "
       "'--port=5000'"},
      {{"-d=12"},
       "-d=12: a short option takes its value after a space; write '-d 12' "
       "or '--destroy_session=12'"},
      {{"--start", "-w=3"}, "write '-w 3' or '--workers=3'"},
  };
  for (const Case& c : cases) {
    // A server the old code started from a value it took ends with the test.
    std::vector<std::string> args = c.args;
    if (args[0] == "--start") args.insert(args.end(), {"-p", "31007"});
    ExpectError(args, c.what, {{"SHMCACHE_WATCH_PID", std::to_string(getpid())}});
  }
  ExpectError({"-g"},
              "SHMCACHE_PORT: port ' 5000' is not a number in 1025..65535 "
              "(white space before it)",
              {{"SHMCACHE_PORT", " 5000"}});
  EXPECT_TRUE(ListDir(run_dir_).empty()) << "nothing was started";
  // Values read as typed are taken: "010" is ten, a value may start with
  // '-' where it is one ("-d -5" is a session id out of range).
  ExpectError({"-d", "-5"}, "session id '-5' is not a number in 1..4294967295, as");
  ExpectError({"--start", "-w", "010", "--json"}, "--json applies to");
}

// Session 0 is no session (ids are non-zero; a launcher that could not
// create one exports 0): refused as such before the server is asked, not
// "does not exist".
TEST_F(CliTest, SessionZeroIsNoSessionId) {
  ExpectError({"-d", "0"},
              "session id 0 is no session: ids are 1..4294967295, as 'shmcache -g' "
              "prints (a launcher that could not create a session exports 0); list the "
              "sessions with 'shmcache --list_sessions'");
  ExpectError({"--destroy_session", "00"}, "session id 0 is no session");
}

// A session id refused before the server is asked names the commands that
// list and create sessions on the port given, wherever -p stands: without
// it they would ask the server on the default port.
TEST_F(CliTest, ABadSessionIdSuggestsCommandsOnThePortGiven) {
  for (const char* id : {"xyz", "0"}) {
    ExpectError({"-d", id, "-p", "51999"}, "'shmcache --list_sessions -p 51999'");
    ExpectError({"-p", "51999", "--destroy_session", id},
                "'shmcache --list_sessions -p 51999'");
    ExpectError({"-d", id, "-p", "51999"}, "'shmcache -g -p 51999' prints");
    // The default port needs none.
    ExpectError({"-d", id, "-p", "50052"}, "'shmcache --list_sessions'");
  }
}

TEST_F(CliTest, MemoryCapBelowOneSegment) {
  ExpectError({"--start", "-r", "1e-300"}, "below one segment (4 MB); use a larger -r");
  ExpectError({"--start", "--memory_cap_mb", "3"},
              "memory cap of 3 MB is below one segment (4 MB)");
  // The daemon started by hand says the same, before it makes anything.
  for (const char* cap : {"--memory_cap_ratio=1e-300", "--memory_cap_mb=3"}) {
    CommandResult r = RunCommand({DaemonPath(), cap, "--run_dir=" + run_dir_ + "/never"});
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_NE(r.err.find("below one segment (4 MB)"), std::string::npos) << r.Describe();
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(PathExists(run_dir_ + "/never"));
  }
}

TEST_F(CliTest, WorkerCountOutOfRange) {
  ExpectError({"--start", "-w", "0"},
              "worker count '0' is not a number in 1..512; give -w (--workers) a whole "
              "number of threads in 1..512, or leave it out for half the CPUs");
  ExpectError({"--start", "-w", "513"}, "worker count '513'");
  ExpectError({"--start", "-w", "two"}, "worker count 'two'");
}

TEST_F(CliTest, TwoCommands) {
  ExpectError({"--list_sessions", "--server_info"}, "only one command");
  ExpectError({"--start", "--stop"}, "only one command");
  ExpectError({"-g", "-d", "5"}, "only one command");
}

TEST_F(CliTest, StartOptionWithAnotherCommand) {
  ExpectError({"--list_sessions", "-w", "2"}, "-w applies to --start only");
  // --json would be ignored: -g and the others print text.
  for (const char* cmd : {"-g", "--stop", "--metrics", "--start"}) {
    ExpectError({cmd, "--json", "-p", "31003"},
                "--json applies to --list_sessions and --server_info only",
                {{"SHMCACHE_WATCH_PID", std::to_string(getpid())}});
  }
}

TEST_F(CliTest, MetricsFileOptions) {
  ExpectError({"--metrics", "--metrics_file", "/tmp/shmcache.prom"},
              "--metrics_file applies to --start only");
  ExpectError({"--start", "--metrics_file", "shmcache.prom"}, "not an absolute path");
  ExpectError({"--start", "--metrics_interval", "0"},
              "give --metrics_interval a whole number of seconds in 1..3600, or leave it "
              "out for 5");
  ExpectError({"--start", "--metrics_interval", "often"}, "1..3600");
  // An interval alone would be ignored: no file is written. (A server the
  // old code started anyway ends with this test.)
  ExpectError({"--start", "--metrics_interval", "10", "-p", "23458"},
              "no --metrics_file is given",
              {{"SHMCACHE_WATCH_PID", std::to_string(getpid())}});
  CommandResult r = RunCommand(
      {DaemonPath(), "--metrics_interval=10", "--run_dir=" + run_dir_ + "/never"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("no --metrics_file is given"), std::string::npos) << r.Describe();
  EXPECT_FALSE(PathExists(run_dir_ + "/never"));
  ExpectError({"--start", "--metrics_file", "/no-such-dir/shmcache.prom"},
              "/no-such-dir does not exist");
}

TEST_F(CliTest, PortOutsideTheRange) {
  // The range, and what to give instead.
  ExpectError({"--list_sessions", "-p", "80"},
              "port '80' is not a number in 1025..65535; use a whole number in that "
              "range, such as the default 50052 (it names the instance: no TCP port is "
              "opened)");
  ExpectError({"--list_sessions", "-p", "1024"}, "1025..65535");
  ExpectError({"--list_sessions", "-p", "65536"}, "1025..65535");
  ExpectError({"--list_sessions", "--port=0"}, "1025..65535");
  ExpectError({"--list_sessions"}, "SHMCACHE_PORT", {{"SHMCACHE_PORT", "99999"}});
}

// Environment values are read as the flags are: an empty SHMCACHE_PORT or
// SHMCACHE_HOST (an unset variable in a script) was the default, a
// SHMCACHE_HUGE_TMPFS of "yes" or "false" was on. Each is refused naming
// the variable, what was wrong and what to give.
TEST_F(CliTest, EnvironmentValuesAreReadAsTheFlagsAre) {
  ExpectError({"-g"},
              "SHMCACHE_PORT: port '' is not a number in 1025..65535 (it is empty); "
              "use a whole number in that range",
              {{"SHMCACHE_PORT", ""}});
  ExpectError({"-g"}, "or unset SHMCACHE_PORT for the default", {{"SHMCACHE_PORT", ""}});
  ExpectError({"-g"},
              "SHMCACHE_HOST: host '' is empty; set it to 127.0.0.1, localhost or ::1, "
              "or unset it for 127.0.0.1",
              {{"SHMCACHE_HOST", ""}});
  const std::string watch = std::to_string(getpid());
  for (const char* value : {"yes", "", " 1", "true", "2"}) {
    ExpectError(
        {"--start", "-p", "31013"},
        fmt::format("SHMCACHE_HUGE_TMPFS='{}' is neither 0 nor 1; set it to 1 for "
                    "a huge-page tmpfs of the server's own (as root), or to 0 or "
                    "unset it for none",
                    value),
        {{"SHMCACHE_HUGE_TMPFS", value}, {"SHMCACHE_WATCH_PID", watch}});
  }
  // (A server the old code started ends with this test.)
  CommandResult r = RunCommand({DaemonPath(), "--port=31014", "--watch_pid=" + watch,
                                "--run_dir=" + run_dir_ + "/never"},
                               Env{{"SHMCACHE_HUGE_TMPFS", "on"}});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("SHMCACHE_HUGE_TMPFS='on' is neither 0 nor 1"), std::string::npos)
      << r.Describe();
  EXPECT_FALSE(PathExists(run_dir_ + "/never"));
  EXPECT_TRUE(ListDir(run_dir_).empty()) << "nothing was started";
}

// A port with a leading zero is refused, by flag and by SHMCACHE_PORT: it
// names files without one, and a shell's $((050921)) or strtol base 0
// reads it as octal.
TEST_F(CliTest, APortWithALeadingZeroIsRefused) {
  ExpectError({"--list_sessions", "-p", "050921"},
              "port '050921' is not a number in 1025..65535 (a leading zero); use a "
              "whole number in that range");
  ExpectError({"-g", "--port=05000"},
              "port '05000' is not a number in 1025..65535 (a "
              "leading zero)");
  ExpectError({"-g"},
              "SHMCACHE_PORT: port '050921' is not a number in 1025..65535 (a "
              "leading zero)",
              {{"SHMCACHE_PORT", "050921"}});
  CommandResult r =
      RunCommand({DaemonPath(), "--port=050921", "--run_dir=" + run_dir_ + "/never"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("(a leading zero)"), std::string::npos) << r.Describe();
  EXPECT_FALSE(PathExists(run_dir_ + "/never"));
}

TEST_F(CliTest, NonLocalHost) {
  ExpectError({"--list_sessions", "-h", "10.0.0.7"}, "'10.0.0.7' is not this machine");
  ExpectError({"--start", "--hostname", "example.com"},
              "'example.com' is not this machine");
  ExpectError({"--list_sessions"},
              "SHMCACHE_HOST: host '192.168.1.1' is not this machine",
              {{"SHMCACHE_HOST", "192.168.1.1"}});
}

TEST_F(CliTest, SpillDirRelativeMissingOrNotWritable) {
  // Each says what to do too.
  ExpectError({"--start", "-s", "relative/dir"},
              "spill directory 'relative/dir' is not an absolute path; give one that "
              "starts with /");
  // Empty: once "no spill dir" to the admin and a missing value to the
  // daemon, which exited without a word the admin could pass on.
  ExpectError({"--start", "-s", ""}, "spill directory '' is not an absolute path");
  ExpectError({"--start", "--spilldir="}, "--spilldir needs a value");
  ExpectError({"--start", "-s", run_dir_ + "/does-not-exist"},
              "spill directory " + run_dir_ +
                  "/does-not-exist does not exist; create it "
                  "first (mkdir -p)");
  // Not writable: a directory of root's seen by another user, or a
  // read-only directory of ours.
  // (Under /tmp so that every user can reach it; removed however the test
  // ends, a skip included.)
  TempDir ro_dir("/tmp");
  const std::string& ro = ro_dir.path();
  if (geteuid() == 0) {
    ASSERT_EQ(chmod(ro.c_str(), 0755), 0);
    CommandResult r = RunCommand({AdminPath(), "--start", "-s", ro, "-p", "31001"},
                                 {{"SHMCACHE_RUN_DIR", run_dir_}}, 60,
                                 /*uid=*/65534);
    if (r.exit_code == 126 || r.exit_code == 127) {
      GTEST_SKIP() << "cannot run the admin as nobody: " << r.Describe();
    }
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_NE(r.err.find("is not writable by this user; give -s a directory it can "
                         "write"),
              std::string::npos)
        << r.Describe();
  } else {
    ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
    ExpectError({"--start", "-s", ro, "-p", "31001"},
                "is not writable by this user; give -s a directory it can write");
  }
  EXPECT_TRUE(ListDir(run_dir_).empty()) << "nothing was started";
  chmod(ro.c_str(), 0755);
}

// SHMCACHE_WATCH_PID becomes the daemon's --watch_pid: a value the daemon
// would refuse is named by the admin, never "exited before reporting
// readiness".
TEST_F(CliTest, AWatchPidThatIsNoPidIsNamed) {
  for (const char* bad : {"abc", "0", "-5", "99999999999"}) {
    ExpectError({"--start", "-p", "31003"},
                fmt::format("SHMCACHE_WATCH_PID '{}' is not a number in 1..", bad),
                {{"SHMCACHE_WATCH_PID", bad}});
  }
  EXPECT_TRUE(ListDir(run_dir_).empty()) << "nothing was started";
}

TEST_F(CliTest, ServerNotRunning) {
  for (const char* cmd : {"-g", "--list_sessions", "--server_info", "--metrics"}) {
    ExpectError({cmd, "-p", "31002"}, "not running");
  }
  ExpectError({"-d", "5", "-p", "31002"}, "not running");
  // --stop with no server: an error (as cache_admin's), said as a stop
  // finds it, not with the hint to start one.
  CommandResult stop = Run({"--stop", "-p", "31002"});
  EXPECT_EQ(stop.exit_code, 1) << stop.Describe();
  EXPECT_EQ(
      stop.err,
      "shmcache: error: no cache server is running on port 31002; nothing to stop\n")
      << stop.Describe();
  EXPECT_TRUE(stop.out.empty()) << stop.Describe();
}

// A killed server leaves its memory for the next start to adopt. --stop
// then finds no server: it says what is left where and how to free it,
// where it said only "nothing to stop", and what it says works.
TEST_F(CliTest, StopWithNoServerNamesWhatAKilledOneLeft) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  server.NewSession();  // the sessions list: a file of the instance
  server.Kill();
  const size_t left = server.ShmFiles().size();
  ASSERT_GT(left, 0u);
  Env env = server.AdminEnv();
  env.emplace_back("SHMCACHE_SHM_DIR", server.shm_dir());
  const std::string port = std::to_string(server.port());
  CommandResult r = RunCommand({AdminPath(), "--stop", "-p", port}, env);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err.rfind(fmt::format("shmcache: error: no cache server is running on port "
                                    "{}; nothing to stop, but one that ended without "
                                    "--stop left {} file{}",
                                    port, left, left == 1 ? "" : "s"),
                        0),
            0u)
      << r.Describe();
  EXPECT_NE(r.err.find(fmt::format("in {}: 'shmcache --start -p {}' serves them again, "
                                   "and --stop after it removes them",
                                   server.shm_dir(), port)),
            std::string::npos)
      << r.Describe();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // A few KB read "(0.0 MB)", as if nothing were held.
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(left \d+ files? \((\d+\.\d MB|\d+ KB|\d+ bytes)\) in)")))
      << r.Describe();
  EXPECT_EQ(r.err.find("(0.0 MB)"), std::string::npos) << r.Describe();
  CommandResult start = RunCommand({AdminPath(), "--start", "-p", port}, env);
  ASSERT_EQ(start.exit_code, 0) << start.Describe();
  CommandResult stop = RunCommand({AdminPath(), "--stop", "-p", port}, env);
  EXPECT_EQ(stop.exit_code, 0) << stop.Describe();
  EXPECT_TRUE(server.ShmFiles().empty()) << testing::PrintToString(server.ShmFiles());
}

// A server started with --shm_dir and killed: --stop given the same
// --shm_dir counts what it left there (without it, it looks where a server
// started without one puts its files: nothing of this server's is there).
TEST_F(CliTest, StopWithNoServerCountsWhatAKilledOneLeftInTheShmDirGivenByFlag) {
  TestServer server;  // started with --shm_dir (TestServer)
  ASSERT_TRUE(server.ok());
  server.NewSession();
  server.Kill();
  const size_t left = server.ShmFiles().size();
  ASSERT_GT(left, 0u);
  const std::string port = std::to_string(server.port());
  CommandResult r =
      RunCommand({AdminPath(), "--stop", "-p", port, "--shm_dir", server.shm_dir()},
                 server.AdminEnv());
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find(fmt::format("--stop left {} file{}", left, left == 1 ? "" : "s")),
            std::string::npos)
      << r.Describe();
  // The command it gives starts a server that serves them (one without
  // --shm_dir would look in /dev/shm, and find none of them).
  EXPECT_NE(r.err.find(fmt::format("in {}: 'shmcache --start -p {} --shm_dir {}' serves "
                                   "them again",
                                   server.shm_dir(), port, server.shm_dir())),
            std::string::npos)
      << r.Describe();
  CommandResult start =
      RunCommand({AdminPath(), "--start", "-p", port, "--shm_dir", server.shm_dir()},
                 server.AdminEnv());
  ASSERT_EQ(start.exit_code, 0) << start.Describe();
  CommandResult stop = RunCommand({AdminPath(), "--stop", "-p", port}, server.AdminEnv());
  EXPECT_EQ(stop.exit_code, 0) << stop.Describe();
  EXPECT_TRUE(server.ShmFiles().empty()) << testing::PrintToString(server.ShmFiles());
}

// A server of this user on the port, running under another run dir: --stop
// in this run dir has nothing to stop, names that server and how to stop
// it, and never counts its files as left by a killed one.
TEST_F(CliTest, StopInAnotherRunDirNamesTheServerOfThePortAndCountsNothingLeft) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  server.NewSession();
  ASSERT_FALSE(server.ShmFiles().empty());
  EXPECT_EQ(StopFromAnotherRunDir(server),
            fmt::format("runs with run dir {} (process id {}): stop it with "
                        "'SHMCACHE_RUN_DIR={} shmcache --stop -p {}'\n",
                        server.run_dir(), server.pid(), server.run_dir(), server.port()));
  CommandResult g = server.Admin({"-g"});
  EXPECT_EQ(g.exit_code, 0) << g.Describe();
}

// The same for a server whose run dir has a space: the commands named are
// quoted as a shell reads them (the run dir was printed bare, and did not
// paste), and pasted into /bin/sh (the admin's path for "shmcache"), the
// one -g names reaches that server.
TEST_F(CliTest, TheCommandsNamedForARunDirWithASpacePasteIntoAShell) {
  TempDir parent;
  ServerOptions options;
  options.run_dir = parent.path() + "/my dir";
  TestServer server(options);
  ASSERT_TRUE(server.ok());
  const std::string there =
      fmt::format("SHMCACHE_RUN_DIR='{}' shmcache", server.run_dir());
  const std::string port = std::to_string(server.port());
  EXPECT_EQ(
      StopFromAnotherRunDir(server),
      fmt::format("runs with run dir {} (process id {}): stop it with '{} --stop -p "
                  "{}'\n",
                  server.run_dir(), server.pid(), there, port));
  const std::string ask = fmt::format("{} -g -p {}", there, port);
  ExpectError({"-g", "-p", port},
              fmt::format("ask it with '{}', or stop it with '{} --stop -p {}' before",
                          ask, there, port));
  std::string pasted = ask;
  pasted.replace(pasted.find("shmcache -g"), 8, AdminPath());
  CommandResult g = RunCommand({"/bin/sh", "-c", pasted});
  EXPECT_EQ(g.exit_code, 0) << pasted << "\n" << g.Describe();
}

// -g, -d, --list_sessions, --server_info and --metrics in this run dir,// -g, -d,
// --list_sessions, --server_info and --metrics in this run dir, where a server of this
// user runs on the port under another run dir: the message names it and the command that
// reaches it, which works. They said "not running ... start it with 'shmcache --start'",
// and that start is refused (one server per user and port).
TEST_F(CliTest, ACommandInAnotherRunDirNamesTheServerOfThePort) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  const uint32_t session = server.NewSession();
  const std::string port = std::to_string(server.port());
  const std::vector<std::vector<std::string>> commands = {{"-g"},
                                                          {"-d", std::to_string(session)},
                                                          {"--list_sessions"},
                                                          {"--server_info", "--json"},
                                                          {"--metrics"}};
  for (const std::vector<std::string>& command : commands) {
    std::vector<std::string> args = command;
    args.insert(args.end(), {"-p", port});
    const std::string written = fmt::format("{}", fmt::join(command, " "));
    ExpectError(args,
                fmt::format("no cache server is running on port {} with run dir {}; a "
                            "server of yours on port {} runs with run dir {} (process id "
                            "{}), and a user has one server per port: ask it with "
                            "'SHMCACHE_RUN_DIR={} shmcache {} -p {}', or stop it with "
                            "'SHMCACHE_RUN_DIR={} shmcache --stop -p {}' before starting "
                            "one here",
                            port, run_dir_, port, server.run_dir(), server.pid(),
                            server.run_dir(), written, port, server.run_dir(), port));
  }
  CommandResult start = Run({"--start", "-p", port});
  EXPECT_EQ(start.exit_code, 1) << "the start the old message suggested is refused\n"
                                << start.Describe();
  EXPECT_FALSE(PathExists(fmt::format("{}/shmcached-{}.lock", run_dir_, port)))
      << "the refused start leaves no lock file in its run dir";
  CommandResult asked = server.Admin({"--list_sessions"});
  EXPECT_EQ(asked.exit_code, 0) << asked.Describe();
}

// The opens inotify reported on `fd` (a watch of one file) not yet read.
int OpensSeen(int fd) {
  int opens = 0;
  alignas(inotify_event) char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
    for (char* p = buf; p < buf + n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(p);
      opens += (e->mask & IN_OPEN) != 0;
      p += sizeof(inotify_event) + e->len;
    }
  }
  return opens;
}

// That message is the connect's, made once: the admin hands the library its
// command line (ClientOptions::admin_command). It read the host lock a
// second time to say it again with that command, and two reads of a lock
// that changed between them (the server stopping) could disagree.
TEST_F(CliTest, ACommandInAnotherRunDirReadsTheHostLockOnce) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  const std::string port = std::to_string(server.port());
  const int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(fd, 0);
  // Closes too: inotify merges an event into the same one unread before it.
  ASSERT_GE(inotify_add_watch(fd, HostLockPath(server.port()).c_str(),
                              IN_OPEN | IN_CLOSE_NOWRITE),
            0);
  CommandResult r = Run({"--list_sessions", "-p", port});
  const int opens = OpensSeen(fd);
  close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  const std::string explained = fmt::format("runs with run dir {}", server.run_dir());
  const size_t at = r.err.find(explained);
  EXPECT_NE(at, std::string::npos) << r.Describe();
  EXPECT_EQ(r.err.find(explained, at + 1), std::string::npos) << "said twice\n"
                                                              << r.Describe();
  EXPECT_NE(r.err.find(fmt::format("'SHMCACHE_RUN_DIR={} shmcache --list_sessions -p {}'",
                                   server.run_dir(), port)),
            std::string::npos)
      << "the admin's own command\n"
      << r.Describe();
  EXPECT_EQ(opens, 1) << "the host lock is read once";
}

// The same where the server of this very run dir lost its socket (removed
// by hand, or a clean-up of /tmp), or something else took the socket's
// name while it ran (a FIFO made there): not "not running; start it"
// (refused: the server holds the port), but what became of its socket and
// how to restart it. The FIFO was told "not running ... start it".
TEST_F(CliTest, ACommandWhoseServersSocketWasRemovedOrReplacedSaysSo) {
  for (const bool replaced : {false, true}) {
    TestServer server;
    ASSERT_TRUE(server.ok());
    ASSERT_EQ(unlink(server.socket_path().c_str()), 0);
    if (replaced) {
      ASSERT_EQ(mkfifo(server.socket_path().c_str(), 0600), 0);
    }
    CommandResult r = server.Admin({"-g"});
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    const std::string what =
        replaced ? "was replaced by a FIFO while it ran"
                 : "is gone (removed while it ran, by hand or a clean-up of /tmp)";
    EXPECT_EQ(r.err,
              fmt::format("shmcache: error: the cache server on port {} (process "
                          "id {}) runs with run dir {}, but its socket {} {}: "
                          "restart it with 'shmcache --stop -p {}' and 'shmcache "
                          "--start -p {}'\n",
                          server.port(), server.pid(), server.run_dir(),
                          server.socket_path(), what, server.port(), server.port()))
        << r.Describe();
  }
}

// --stop of a running server whose socket alone was removed (its lock file
// kept), or replaced by a file: it said the server "was still starting
// (not answering yet)", a server that had served for as long as it ran.
// It says what became of the socket, and stops it as a --stop through the
// socket would: its shared memory removed.
TEST_F(CliTest, StopOfAServerWhoseSocketWasRemovedOrReplacedSaysSo) {
  for (const bool replaced : {false, true}) {
    TestServer server;
    ASSERT_TRUE(server.ok());
    server.NewSession();
    ASSERT_FALSE(server.ShmFiles().empty());
    ASSERT_EQ(unlink(server.socket_path().c_str()), 0);
    if (replaced) std::ofstream(server.socket_path()) << "not a socket\n";
    CommandResult r = server.Stop();
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    EXPECT_EQ(r.out, fmt::format("Cache server on port {} (process id {}) has been "
                                 "stopped; its socket {} had been {}.\n",
                                 server.port(), server.pid(), server.socket_path(),
                                 replaced ? "replaced by a regular file" : "removed"))
        << r.Describe();
    EXPECT_TRUE(ProcessExited(server.pid()));
    EXPECT_EQ(server.ShmFiles(), std::vector<std::string>{}) << "stopped as --stop does";
    if (!ProcessExited(server.pid())) server.Kill();  // never outlives the test
  }
}

// A run dir that is a link (planted in /tmp, or left by hand): -g says so
// and what to do, as --start does, where it said "not running ... start
// it", and that start is refused.
TEST_F(CliTest, ACommandInARunDirThatIsALinkSaysSo) {
  const std::string real = run_dir_ + "/real";
  const std::string link = run_dir_ + "/link";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  const std::string why = fmt::format(
      "shmcache: error: {} is a symbolic link owned by {}: not this user's own "
      "directory, refusing to use it; remove it (as its owner or root), or set "
      "SHMCACHE_RUN_DIR to a directory of your own, mode 0700\n",
      link, OwnerName(geteuid()));
  for (const char* command : {"-g", "--start"}) {
    CommandResult r = RunCommand(
        {AdminPath(), command, "-p", "31004"},
        {{"SHMCACHE_RUN_DIR", link}, {"SHMCACHE_WATCH_PID", std::to_string(getpid())}});
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_EQ(r.err, why) << command << "\n" << r.Describe();
  }
  EXPECT_TRUE(ListDir(real).empty()) << "nothing was made through the link";
}

// A run dir of this user's that other users may write (root's own 0777
// one): the message says that, its mode, and the chmod that fixes it,
// where it said "not this user's own directory"; that chmod, pasted into a
// shell, makes it usable.
TEST_F(CliTest, AnOwnRunDirOthersMayWriteSaysItsModeAndTheChmod) {
  const std::string dir = run_dir_ + "/open dir";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  const Env env = {{"SHMCACHE_RUN_DIR", dir},
                   {"SHMCACHE_WATCH_PID", std::to_string(getpid())}};
  const std::string chmod_command = fmt::format("chmod 700 '{}'", dir);
  for (const char* command : {"-g", "--start"}) {
    CommandResult r = RunCommand({AdminPath(), command, "-p", "31005"}, env);
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_EQ(r.err, fmt::format(
                         "shmcache: error: {} is a directory owned by {}, mode 0777: "
                         "other users may write into it, refusing to use it; if nothing "
                         "in it is another user's, make it yours alone with '{}', or "
                         "remove it (as its owner or root), or set SHMCACHE_RUN_DIR to a "
                         "directory of your own, mode 0700\n",
                         dir, OwnerName(geteuid()), chmod_command))
        << command << "\n"
        << r.Describe();
  }
  CommandResult fix = RunCommand({"/bin/sh", "-c", chmod_command});
  ASSERT_EQ(fix.exit_code, 0) << fix.Describe();
  CommandResult g = RunCommand({AdminPath(), "-g", "-p", "31005"}, env);
  EXPECT_EQ(g.err.find(dir + " is"), std::string::npos) << g.Describe();
}

// The state letter of process `pid` ('T': stopped), from /proc.// The state letter of
// process `pid` ('T': stopped), from /proc.
char ProcessStateLetter(pid_t pid) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("State:", 0) == 0 && line.size() > 7) return line[7];
  }
  return '?';
}

// A server stopped by SIGSTOP (Ctrl-Z, a debugger) answers nothing: -g
// says so and how to resume it, where it said it timed out; --stop resumes
// and stops it, where it sent SIGTERM alone, waited 30 s and failed
// ("did not exit ...; end it with 'kill -9'").
TEST_F(CliTest, AStoppedServerIsNamedAndStopResumesAndStopsIt) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  const std::string port = std::to_string(server.port());
  // However the test ends, even killed: a stopped server cannot see that
  // the process it watches is gone (a killed CI run left one stopped).
  const ContinuedAfter continued(server.pid());
  ASSERT_TRUE(StopProcess(server.pid()));
  ASSERT_EQ(ProcessStateLetter(server.pid()), 'T');
  CommandResult g = server.Admin({"-g"});
  EXPECT_EQ(g.exit_code, 1) << g.Describe();
  EXPECT_EQ(g.err, fmt::format("shmcache: error: the cache server on port {} (process id "
                               "{}) is stopped (SIGSTOP, Ctrl-Z or a debugger) and "
                               "answers nothing: resume it with 'kill -CONT {}', or stop "
                               "it with 'shmcache --stop -p {}'\n",
                               port, server.pid(), server.pid(), port))
      << g.Describe();
  CommandResult stop = server.Stop();
  EXPECT_EQ(stop.exit_code, 0) << stop.Describe();
  EXPECT_EQ(stop.out, fmt::format("Cache server on port {} (process id {}) was stopped "
                                  "(SIGSTOP, Ctrl-Z or a debugger) and answered nothing; "
                                  "it has been resumed and stopped.\n",
                                  port, server.pid()))
      << stop.Describe();
  if (!ProcessExited(server.pid())) {  // never outlives the test
    kill(server.pid(), SIGCONT);
    server.Kill();
  }
}

// The same while that server has taken the host lock but not yet written
// its pid and run dir into it (here: emptied under the lock it holds):
// --stop has no run dir to name, so it says one is starting and to try
// again, not "SHMCACHE_RUN_DIR=? shmcache --stop".
TEST_F(CliTest, StopInAnotherRunDirWhileThatServerIsStartingSaysToTryAgain) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  server.NewSession();
  ASSERT_EQ(truncate(HostLockPath(server.port()).c_str(), 0), 0);
  EXPECT_EQ(StopFromAnotherRunDir(server),
            "is starting with another run dir (it has not written which yet): try "
            "again in a moment\n");
}

// A killed server left its files in this run dir's shm dir; a server of
// this user now runs on the port under another run dir AND another shm
// dir: --stop names it, and still counts what the killed one left here
// (its own files are elsewhere), where it counted nothing.
TEST_F(CliTest, StopInAnotherRunDirAndShmDirStillCountsWhatAKilledOneLeftHere) {
  TestServer killed;
  ASSERT_TRUE(killed.ok());
  killed.NewSession();
  killed.Kill();
  const size_t left = killed.ShmFiles().size();
  ASSERT_GT(left, 0u);
  ServerOptions elsewhere;
  elsewhere.port = killed.port();
  TestServer running(elsewhere);  // its own run dir and shm dir
  ASSERT_TRUE(running.ok()) << running.start_result().Describe();
  running.NewSession();
  const std::string port = std::to_string(killed.port());
  CommandResult r =
      RunCommand({AdminPath(), "--stop", "-p", port, "--shm_dir", killed.shm_dir()},
                 killed.AdminEnv());
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find(fmt::format("runs with run dir {} (process id {})",
                                   running.run_dir(), running.pid())),
            std::string::npos)
      << r.Describe();
  EXPECT_NE(r.err.find(fmt::format("one that ended without --stop left {} file{}", left,
                                   left == 1 ? "" : "s")),
            std::string::npos)
      << r.Describe();
  EXPECT_NE(r.err.find(fmt::format("in {}: once that one is stopped, 'shmcache --start "
                                   "-p {} --shm_dir {}' serves them again",
                                   killed.shm_dir(), port, killed.shm_dir())),
            std::string::npos)
      << r.Describe();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(killed.ShmFiles().size(), left) << "--stop removes nothing";
  EXPECT_FALSE(running.ShmFiles().empty()) << "nor the running server's files";
}

// A running server's socket and lock file removed from its run dir, then
// `then` (given the server and the lock file's path): --stop in that run
// dir stops it, found through its host lock, which names the run dir.
void StopsAServerWhoseRunFilesWereRemovedThen(
    const std::function<void(const TestServer&, const std::string&)>& then) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  server.NewSession();
  const std::string port = std::to_string(server.port());
  const std::string lock = fmt::format("{}/shmcached-{}.lock", server.run_dir(), port);
  ASSERT_EQ(unlink(server.socket_path().c_str()), 0);
  ASSERT_EQ(unlink(lock.c_str()), 0);
  then(server, lock);
  CommandResult r = server.Stop();
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out,
            fmt::format("Cache server on port {} (process id {}) has been stopped; its "
                        "socket and lock file in {} had been removed.\n",
                        port, server.pid(), server.run_dir()))
      << r.Describe();
  if (!ProcessExited(server.pid()))
    server.Kill();  // not stopped: never outlives the test
}

// The socket and lock file of a running server were removed from its run
// dir (by hand, or a clean-up of /tmp): --stop in that run dir finds it
// through the host lock, which names the same run dir, and stops it. It
// said there was no server with that run dir, and to stop the one with
// that run dir with the very command just given.
TEST_F(CliTest, StopStopsAServerWhoseSocketAndLockFileWereRemoved) {
  StopsAServerWhoseRunFilesWereRemovedThen([](const TestServer&, const std::string&) {});
}

// The same, where a neighbour then took the run dir's place (a clean-up of
// /tmp removed it, and /tmp is open to all) and put a link at the lock
// file's name: the link is no lock of this user's, and --stop still finds
// the server through its host lock. It gave up with the probe's error
// ("cannot open ...: Too many levels of symbolic links"), and the server
// ran on.
TEST_F(CliTest, StopStopsAServerWhoseRunDirANeighbourTook) {
  StopsAServerWhoseRunFilesWereRemovedThen(
      [](const TestServer& server, const std::string& lock) {
        // As root: the neighbour's own directory (root may still look in
        // it, and remove it at the end).
        if (geteuid() == 0) {
          ASSERT_EQ(chown(server.run_dir().c_str(), 65534, 65534), 0);
        }
        ASSERT_EQ(symlink("/etc/passwd", lock.c_str()), 0);
      });
}

// A host lock file another user planted, held, naming a run dir: no
// server of this user's. --stop says there is nothing to stop, where it
// named "a server of yours" and a command with the planted run dir.
TEST_F(CliTest, StopIgnoresAHostLockOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another user";
  TestServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_EQ(server.Stop().exit_code, 0);
  const std::string port = std::to_string(server.port());
  const std::string host = HostLockPath(server.port());
  const int fd = open(host.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << host;
  const std::string text = "1\n/run/planted\n";
  EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  EXPECT_EQ(fchown(fd, 65534, 65534), 0);
  EXPECT_EQ(flock(fd, LOCK_EX), 0);
  CommandResult r = server.Admin({"--stop"});
  unlink(host.c_str());
  close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err,
            fmt::format("shmcache: error: no cache server is running on port {}; nothing "
                        "to stop\n",
                        port))
      << r.Describe();
}

// A FIFO planted at the host lock's name (in /dev/shm, open to all): --stop
// says there is nothing to stop, where its probe's open waited for a
// writer for good.
TEST_F(CliTest, StopIsNotHeldByAFifoAtTheHostLock) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_EQ(server.Stop().exit_code, 0);
  const std::string host = HostLockPath(server.port());
  ASSERT_EQ(mkfifo(host.c_str(), 0666), 0) << host;
  CommandResult r =
      RunCommand({AdminPath(), "--stop", "-p", std::to_string(server.port())},
                 server.AdminEnv(), /*timeout_s=*/20);
  unlink(host.c_str());
  EXPECT_FALSE(r.timed_out) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("nothing to stop"), std::string::npos) << r.Describe();
}

// What the kernel says of a process's start, read here as the lock files
// record it: field 22 of /proc/PID/stat (clock ticks since boot, counted
// after the ')' that ends the name, which may hold spaces), and the boot.
std::string StartTicks(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;
  return field;
}
std::string BootId() {
  std::string id;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), id);
  return id;
}

// A forked process that runs `first` (false: it exits), then calls itself
// shmcached, as a server of this user does, until it is killed
// (KillAndReap) or this process ends.
pid_t NamedShmcached(const std::function<bool()>& first = [] { return true; }) {
  const pid_t pid = ForkChild([&first] {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!first()) return 2;
    prctl(PR_SET_NAME, "shmcached");
    for (;;) pause();
    return 0;
  });
  EXPECT_TRUE(WaitFor([pid] {
    std::string comm;
    std::getline(std::ifstream(fmt::format("/proc/{}/comm", pid)), comm);
    return comm == "shmcached" || ProcessExited(pid);
  }));
  EXPECT_FALSE(ProcessExited(pid)) << "its `first` failed";
  return pid;
}

// Takes the flock of the lock file at `path` as a server does, leaving
// what is written in it as it is (a server that has just taken the lock,
// before it writes its own text); -1 when it cannot.
int HoldLockFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A pid in a lock file goes to another process once its writer has ended
// (pids wrap on a busy host), and that one may be another shmcached of this
// user: the instance lock, held (a server starting, not yet written), names
// the pid of such a process with the start the file's writer had, earlier
// than the process's own. --stop signals nothing and says what it found;
// it SIGTERMed the process, which passed the name and user check.
TEST_F(CliTest, StopSignalsNoProcessThatStartedAfterTheWriterOfTheLockFile) {
  const pid_t other = NamedShmcached();
  const std::string port = "31004";
  const std::string lock = fmt::format("{}/shmcached-{}.lock", run_dir_, port);
  const int fd = HoldLockFile(lock);
  ASSERT_GE(fd, 0) << lock;
  const std::string text =
      fmt::format("{} {} {}\n", other, std::stoull(StartTicks(other)) - 1, BootId());
  ASSERT_EQ(pwrite(fd, text.data(), text.size(), 0), static_cast<ssize_t>(text.size()));
  CommandResult r = Run({"--stop", "-p", port});
  close(fd);
  int status = 0;
  const bool ended = WaitChild(other, &status, std::chrono::milliseconds(0));
  if (!ended) KillAndReap(other);
  EXPECT_FALSE(ended) << "signalled: " << DescribeStatus(status);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find(fmt::format("process id {} in it is no longer the process that "
                                   "wrote it",
                                   other)),
            std::string::npos)
      << r.Describe();
  EXPECT_NE(r.err.find("nothing was signalled"), std::string::npos) << r.Describe();
}

// Exit codes of the namespace body below.
constexpr int kNotSignalled = 0, kSignalled = 2, kStopSaidOtherwise = 3, kNoSetUp = 4,
              kPidNotGivenAgain = 12;

// As pid 1 of a pid namespace of its own (so that a pid can be given
// again): process A writes its pid, start and boot into the lock file as a
// server does, and is killed; B, named shmcached, is given A's pid; the
// lock, taken again (a server starting), still says what A wrote. --stop
// there must leave B alone.
int StopAfterThePidWasGivenAgain(const std::string& run_dir) {
  const std::string lock = fmt::format("{}/shmcached-31006.lock", run_dir);
  const pid_t a = ForkChild([&lock] {
    const int fd = HoldLockFile(lock);
    const std::string text =
        fmt::format("{} {} {}\n", getpid(), StartTicks(getpid()), BootId());
    if (fd < 0 || pwrite(fd, text.data(), text.size(), 0) < 0) return 1;
    for (;;) pause();
    return 0;
  });
  if (!WaitFor([&lock] {
        std::string line;
        std::getline(std::ifstream(lock), line);
        return !line.empty();
      })) {
    return kNoSetUp;
  }
  // Starts are counted in clock ticks (10 ms): B, started in A's tick,
  // could not be told from A. Only a pid chosen by root comes back so soon
  // (a wrap of the pid space takes thousands of forks).
  const uint64_t a_start = std::stoull(StartTicks(a));
  KillAndReap(a);
  if (!WaitFor([a_start] {
        timespec now{};
        clock_gettime(CLOCK_BOOTTIME, &now);
        const uint64_t tick_ns = 1000000000 / static_cast<uint64_t>(sysconf(_SC_CLK_TCK));
        return (static_cast<uint64_t>(now.tv_sec) * 1000000000 +
                static_cast<uint64_t>(now.tv_nsec)) /
                   tick_ns >
               a_start;
      })) {
    return kNoSetUp;
  }
  if (int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC); fd >= 0) {
    const std::string last = std::to_string(a - 1);
    const bool set = write(fd, last.data(), last.size()) > 0;
    close(fd);
    if (!set) return kPidNotGivenAgain;
  }
  const pid_t b = NamedShmcached();
  if (b != a) {
    KillAndReap(b);
    return kPidNotGivenAgain;
  }
  const int fd = HoldLockFile(lock);
  if (fd < 0) return kNoSetUp;
  CommandResult r =
      RunCommand({AdminPath(), "--stop", "-p", "31006"}, {{"SHMCACHE_RUN_DIR", run_dir}});
  close(fd);
  int rc = kNotSignalled;
  int status = 0;
  if (WaitChild(b, &status, std::chrono::milliseconds(0))) {
    rc = kSignalled;
  } else if (r.exit_code != 1 ||
             r.err.find(fmt::format("process id {} in it is no longer the process that "
                                    "wrote it",
                                    a)) == std::string::npos) {
    rc = kStopSaidOtherwise;
  }
  if (rc != kNotSignalled) fprintf(stderr, "%s\n", r.Describe().c_str());
  KillAndReap(b);
  return rc;
}

// The same as above with a pid really given again: the server that wrote
// the lock file was killed, and its pid went to another shmcached of this
// user. --stop SIGTERMed that one.
TEST_F(CliTest, StopSignalsNoProcessGivenTheLockWritersPidAgain) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: a pid namespace to give a pid twice";
  const std::string run_dir = run_dir_;
  const int rc =
      RunInPidNamespace([&run_dir] { return StopAfterThePidWasGivenAgain(run_dir); });
  if (rc == kNoPidNamespace) GTEST_SKIP() << "cannot make a pid and mount namespace here";
  EXPECT_NE(rc, kPidNotGivenAgain) << "could not give the pid again";
  EXPECT_NE(rc, kSignalled) << "the process given the pid was signalled";
  EXPECT_EQ(rc, kNotSignalled);
}

// A real stale lock file: the one a killed server left in its run dir,
// held by a server that has just taken it over and not yet written its own
// pid. --stop names the ended writer, signals nothing, and says to try
// again; it called that pid "not a cache server of yours".
TEST_F(CliTest, StopNamesTheEndedWriterOfAStaleLockFile) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  server.Kill();
  const std::string port = std::to_string(server.port());
  const std::string lock = fmt::format("{}/shmcached-{}.lock", server.run_dir(), port);
  const int fd = HoldLockFile(lock);
  ASSERT_GE(fd, 0) << lock;
  CommandResult r = RunCommand({AdminPath(), "--stop", "-p", port}, server.AdminEnv());
  close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err, fmt::format("shmcache: error: {} is held, but the process that wrote "
                               "it (process id {}) has ended; nothing was signalled. A "
                               "server that is starting writes its own id there in a "
                               "moment: try again\n",
                               lock, server.pid()))
      << r.Describe();
}

// A lock file written by an older version names its server's pid alone.
// Such a server, still starting, is stopped as before: once it is seen to
// be a shmcached of this user.
TEST_F(CliTest, StopStopsAStartingServerWhoseLockFileHasNoStartTime) {
  const std::string port = "31005";
  const std::string lock = fmt::format("{}/shmcached-{}.lock", run_dir_, port);
  const pid_t old = NamedShmcached([&lock] {
    const int fd = HoldLockFile(lock);
    const std::string text = fmt::format("{}\n", getpid());
    return fd >= 0 && pwrite(fd, text.data(), text.size(), 0) > 0;
  });
  CommandResult r = Run({"--stop", "-p", port});
  int status = 0;
  const bool ended = WaitChild(old, &status, std::chrono::seconds(20));
  if (!ended) KillAndReap(old);
  EXPECT_TRUE(ended && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)
      << DescribeStatus(status);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out, fmt::format("Cache server on port {} (process id {}) was still "
                               "starting (not answering yet); it has been stopped.\n",
                               port, old))
      << r.Describe();
}

// The instance's huge-page dir is a name in /dev/shm, where anyone may
// plant a link: --stop's count of what a killed server left never follows
// one (here, to a dir of this user's files named as the instance's).
TEST_F(CliTest, StopWithNoServerCountsNothingThroughALinkAtTheHugePageDir) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_EQ(server.Stop().exit_code, 0);
  const std::string port = std::to_string(server.port());
  TempDir target;
  const std::string planted = target.path() + "/" + server.shm_prefix() + "seg.1";
  std::ofstream(planted) << std::string(8192, 'x');
  const std::string link = HugeShmDir(server.port());
  ASSERT_EQ(symlink(target.path().c_str(), link.c_str()), 0) << link;
  Env env = server.AdminEnv();
  env.emplace_back("SHMCACHE_SHM_DIR", server.shm_dir());
  CommandResult r = RunCommand({AdminPath(), "--stop", "-p", port}, env);
  unlink(link.c_str());
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("nothing to stop"), std::string::npos) << r.Describe();
  EXPECT_EQ(r.err.find("left"), std::string::npos) << r.Describe();
}

TEST_F(CliTest, EveryCommandAgainstARunningServer) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  const CommandResult& start = server.start_result();
  EXPECT_NE(start.out.find("successfully"), std::string::npos) << start.Describe();
  EXPECT_NE(start.out.find(std::to_string(server.port())), std::string::npos);
  EXPECT_NE(start.out.find("Logs: " + server.run_dir() + "/log/shmcached."),
            std::string::npos)
      << start.out;

  // -g: the id is the last token.
  CommandResult g = server.Admin({"-g"});
  ASSERT_EQ(g.exit_code, 0) << g.Describe();
  std::string id = LastToken(g.out);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(id.find_first_not_of("0123456789"), std::string::npos) << g.out;
  CommandResult g2 = server.Admin({"--generate_session"});
  ASSERT_EQ(g2.exit_code, 0);
  std::string id2 = LastToken(g2.out);
  EXPECT_NE(id, id2);

  // Rows in one session, so that the listing has a cache to show.
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  CacheOptions o;
  o.session_id = static_cast<uint32_t>(std::stoul(id));
  o.name = "train";
  o.fingerprint = "fp";
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(client->OpenCache(o, &cache).ok());
  std::vector<uint8_t> row(3000, 7);
  for (uint64_t i = 0; i < 10; ++i)
    ASSERT_TRUE(cache->Put(i, row.data(), row.size()).ok());
  Row out;
  ASSERT_TRUE(cache->Get(3, &out).ok());
  EXPECT_TRUE(cache->Get(99, &out).IsNotFound());

  CommandResult list = server.Admin({"--list_sessions"});
  ASSERT_EQ(list.exit_code, 0) << list.Describe();
  for (const char* col : {"Session", "Cache Id", "Mem cached", "Disk cached",
                          "Avg cache size", "Numa hit", "Hits", "Misses"}) {
    EXPECT_NE(list.out.find(col), std::string::npos) << col << "\n" << list.out;
  }
  EXPECT_NE(list.out.find(id), std::string::npos);
  EXPECT_NE(list.out.find(id2), std::string::npos);
  EXPECT_NE(list.out.find("n/a"), std::string::npos) << "a session without a cache";
  // The session and cache id are separate columns however many digits
  // the (random) ids have.
  EXPECT_TRUE(std::regex_search(
      list.out, std::regex(" " + id + " +" + std::to_string(cache->cache_id()) + " ")))
      << list.out;

  CommandResult lj = server.Admin({"--list_sessions", "--json"});
  ASSERT_EQ(lj.exit_code, 0) << lj.Describe();
  Json sessions = ParseJson(lj.out);
  ASSERT_EQ(sessions.size(), 2u) << lj.out;
  bool found = false;
  for (const Json& s : sessions) {
    if (std::to_string(s.at("session").get<uint32_t>()) != id) {
      EXPECT_TRUE(s.at("caches").empty());
      continue;
    }
    found = true;
    const Json& caches = s.at("caches");
    ASSERT_EQ(caches.size(), 1u);
    const Json& c = caches.front();
    EXPECT_EQ(c.at("name").get<std::string>(), "train");
    EXPECT_EQ(c.at("mem_cached").get<uint64_t>(), 10u);
    EXPECT_EQ(c.at("disk_cached").get<uint64_t>(), 0u);
    EXPECT_GE(c.at("avg_cache_size").get<uint64_t>(), 3000u);
    EXPECT_EQ(c.at("hits").get<uint64_t>(), 1u);
    EXPECT_EQ(c.at("misses").get<uint64_t>(), 1u);
    EXPECT_EQ(c.at("numa_hit").get<uint64_t>(), 1u) << "one node: every hit is local";
    EXPECT_EQ(c.at("full").get<bool>(), false);
    EXPECT_GT(c.at("cache_id").get<uint64_t>(), 0u);
  }
  EXPECT_TRUE(found) << lj.out;

  CommandResult info = server.Admin({"--server_info"});
  ASSERT_EQ(info.exit_code, 0) << info.Describe();
  for (const char* field :
       {"Instance:", "Socket:", "Workers:", "Log level:", "Spill dir:", "Memory cap:",
        "NUMA nodes:", "Shm dir:", "Active sessions:"}) {
    EXPECT_NE(info.out.find(field), std::string::npos) << field << "\n" << info.out;
  }
  EXPECT_NE(info.out.find(server.socket_path()), std::string::npos);
  // The test server's private dir on /dev/shm: 4 KB pages, and why.
  EXPECT_NE(info.out.find(server.shm_dir() + " (4 KB pages: tmpfs "), std::string::npos)
      << info.out;

  CommandResult ij = server.Admin({"--server_info", "--json"});
  ASSERT_EQ(ij.exit_code, 0) << ij.Describe();
  Json si = ParseJson(ij.out);
  EXPECT_EQ(si.at("port").get<int>(), server.port());
  EXPECT_EQ(si.at("socket").get<std::string>(), server.socket_path());
  EXPECT_EQ(si.at("shm_dir").get<std::string>(), server.shm_dir());
  EXPECT_EQ(si.at("shm_huge_pages").get<bool>(), false);
  EXPECT_NE(si.at("shm_pages").get<std::string>().find("without huge pages"),
            std::string::npos);
  EXPECT_EQ(si.at("pid").get<int>(), server.pid());
  EXPECT_GE(si.at("workers").get<int>(), 1);
  EXPECT_EQ(si.at("log_level").get<int>(), 1);
  EXPECT_TRUE(si.at("spill_dir").is_null());
  EXPECT_GT(si.at("memory_cap_bytes").get<uint64_t>(), 0u);
  EXPECT_GT(si.at("memory_used_bytes").get<uint64_t>(), 0u);
  EXPECT_EQ(si.at("numa_nodes").get<int>(), 1);
  EXPECT_EQ(si.at("sessions").size(), 2u);

  // -d: drops the session and its memory; a second time it does not exist.
  cache.reset();
  client.reset();
  size_t files_before = server.ShmFiles().size();
  CommandResult d = server.Admin({"-d", id});
  ASSERT_EQ(d.exit_code, 0) << d.Describe();
  EXPECT_NE(d.out.find(id), std::string::npos);
  EXPECT_LT(server.ShmFiles().size(), files_before);
  CommandResult d2 = server.Admin({"--destroy_session", id});
  EXPECT_EQ(d2.exit_code, 1);
  EXPECT_NE(d2.err.find("session " + id + " does not exist"), std::string::npos)
      << d2.Describe();
  CommandResult after = server.Admin({"--server_info", "--json"});
  ASSERT_EQ(after.exit_code, 0);
  EXPECT_EQ(ParseJson(after.out).at("sessions").size(), 1u);

  // --stop: exit 0, socket and segments gone, a second stop finds nothing.
  CommandResult stop = server.Stop();
  ASSERT_EQ(stop.exit_code, 0) << stop.Describe();
  EXPECT_NE(stop.out.find("stopped"), std::string::npos);
  EXPECT_FALSE(PathExists(server.socket_path()));
  EXPECT_TRUE(server.ShmFiles().empty());
  // A stop that finds no server is an error that says so, not one telling
  // to start a server.
  CommandResult again = server.Admin({"--stop"});
  EXPECT_EQ(again.exit_code, 1) << again.Describe();
  EXPECT_NE(again.err.find("no cache server is running on port"), std::string::npos)
      << again.Describe();
  EXPECT_EQ(again.err.find("--start"), std::string::npos) << again.Describe();
}

// `command` of the admin run as nobody (uid 65534; root only) against
// `server`, its run dir given as SHMCACHE_RUN_DIR.
CommandResult AdminAsNobody(const TestServer& server, const std::string& command) {
  return RunCommand({AdminPath(), command, "-p", std::to_string(server.port())},
                    {{"SHMCACHE_RUN_DIR", server.run_dir()}}, 60, /*uid=*/65534);
}

// False when the admin could not be run as nobody at all (a build tree
// nobody cannot reach).
bool RanAsNobody(const CommandResult& r) {
  return r.exit_code != 126 && r.exit_code != 127;
}

// Another user's server (its run dir, 0700, given as SHMCACHE_RUN_DIR): the
// message says whose it is and what to do instead.
TEST_F(CliTest, AnotherUsersServerIsRefusedWithTheFix) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the admin as another user";
  TestServer server;
  ASSERT_TRUE(server.ok());
  CommandResult r = AdminAsNobody(server, "--list_sessions");
  if (!RanAsNobody(r)) GTEST_SKIP() << "cannot run the admin as nobody: " << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("it belongs to another user, and a server serves only its own; "
                       "start one of yours with 'shmcache --start', with "
                       "SHMCACHE_RUN_DIR unset or a directory of your own"),
            std::string::npos)
      << r.Describe();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// --start as another user with that server's run dir: refused naming whose
// it is and the fix, as for any run dir not the user's own (its parent
// open to all, the run dir 0700), or, its parent closed to that user too,
// with the same fix; the server and its sessions are untouched either way.
// Each server's run dir is under a parent the test makes, so that what the
// user can see does not depend on the SHMCACHE_RUN_DIR the suite runs in.
TEST_F(CliTest, AnotherUsersRunDirAtStartIsRefusedWithTheFix) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the admin as another user";
  for (const mode_t parent_mode : {0755, 0700}) {
    SCOPED_TRACE(fmt::format("the run dir's parent has mode {:04o}", parent_mode));
    TempDir parent;
    ASSERT_EQ(chmod(parent.path().c_str(), parent_mode), 0);
    ServerOptions options;
    options.run_dir = parent.path() + "/srv";
    TestServer server(options);
    ASSERT_TRUE(server.ok());
    CommandResult g = server.Admin({"-g"});
    ASSERT_EQ(g.exit_code, 0) << g.Describe();
    CommandResult r = AdminAsNobody(server, "--start");
    if (!RanAsNobody(r))
      GTEST_SKIP() << "cannot run the admin as nobody: " << r.Describe();
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    const std::string why =
        parent_mode == 0755
            ? server.run_dir() +
                  " is a directory owned by root (uid 0), mode 0700: not this user's own "
                  "directory"
            : "cannot create " + server.run_dir() +
                  ": a directory above it is closed to this user";
    EXPECT_NE(r.err.find(why), std::string::npos) << r.Describe();
    EXPECT_NE(r.err.find("set SHMCACHE_RUN_DIR to a directory of your own"),
              std::string::npos)
        << r.Describe();
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    CommandResult list = server.Admin({"--list_sessions"});
    EXPECT_NE(list.out.find(LastToken(g.out)), std::string::npos) << list.Describe();
  }
}

// A run dir whose parent does not exist (SHMCACHE_RUN_DIR=/scratch/$USER/
// shmcache before /scratch/$USER is made): --start says so and how to make
// it, where it said "cannot create ...: No such file or directory".
TEST_F(CliTest, ARunDirWhoseParentIsMissingIsNamedWithTheMkdir) {
  const std::string parent = run_dir_ + "/missing";
  const std::string dir = parent + "/srv";
  CommandResult r = RunCommand(
      {AdminPath(), "--start", "-p", "31005"},
      {{"SHMCACHE_RUN_DIR", dir}, {"SHMCACHE_WATCH_PID", std::to_string(getpid())}});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err,
            fmt::format("shmcache: error: cannot create {}: the directory above "
                        "it, {}, does not exist; create it first ('mkdir -p {}')\n",
                        dir, parent, parent))
      << r.Describe();
  struct stat st {};
  EXPECT_NE(lstat(parent.c_str(), &st), 0) << "nothing made";
}

// A command after one dash ("shmcache -start", "-help") is told to take
// two, where it was read as a short option with a value: "-start" as -s
// with the spill directory "tart", "-help" as -h with the host "elp".
TEST_F(CliTest, ACommandAfterOneDashIsToldToTakeTwo) {
  for (const std::string command : {"start", "stop", "help", "list_sessions"}) {
    CommandResult r = Run({"-" + command});
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_EQ(r.err, fmt::format("shmcache: error: -{}: a long option takes two dashes; "
                                 "write '--{}'\n",
                                 command, command))
        << r.Describe();
  }
}

TEST_F(CliTest, SessionThatDoesNotExist) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  CommandResult r = server.Admin({"-d", "12345"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("session 12345 does not exist"), std::string::npos)
      << r.Describe();
  // The commands it suggests ask the same server, not the default port's.
  const std::string p = " -p " + std::to_string(server.port());
  EXPECT_NE(r.err.find("'shmcache --list_sessions" + p + "'"), std::string::npos)
      << r.Describe();
  EXPECT_NE(r.err.find("'shmcache -g" + p + "'"), std::string::npos) << r.Describe();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// A cache that asks to spill from a server with no spill dir: the commands
// that restart it with one name its port.
TEST_F(CliTest, SpillingWithoutASpillDirSaysHowToRestartTheServerOfThePort) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(CacheNamed(server.NewSession(), "s", 1, true), &cache);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  const std::string p = " -p " + std::to_string(server.port());
  EXPECT_NE(s.message().find("'shmcache --stop" + p + "', then 'shmcache --start" + p +
                             " -s DIR'"),
            std::string::npos)
      << s.message();
}

// A shm dir on a disk works (the kernel writes the cache's pages back to
// it), at the disk's speed; --start took it silently. It says so as a
// Warning: line, with the way out.
TEST_F(CliTest, StartWithAShmDirOnADiskWarns) {
  TempDir disk;
  struct statfs fs {};
  ASSERT_EQ(statfs(disk.path().c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << disk.path() << " is a tmpfs here";
  ASSERT_EQ(chmod(disk.path().c_str(), 0700), 0);
  ServerOptions options;
  options.shm_dir = disk.path();
  TestServer server(options);
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  const std::string& out = server.start_result().out;
  const std::string warning =
      fmt::format("Warning: shm dir {} is on a disk's filesystem (", disk.path());
  EXPECT_NE(out.find(warning), std::string::npos) << out;
  EXPECT_NE(out.find("give --shm_dir a directory on a tmpfs (/dev/shm, the default)"),
            std::string::npos)
      << out;
  EXPECT_EQ(TestServer().start_result().out.find("on a disk's"), std::string::npos)
      << "not for /dev/shm";
}

// --start says what clients reach the server through (no TCP port: the
// port names a Unix socket in the run dir and the shared-memory files),
// and how to stop it, with the port it was started on.
TEST_F(CliTest, StartSaysWhatItListensOnAndHowToStopIt) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  const std::string& out = server.start_result().out;
  const std::string port = std::to_string(server.port());
  EXPECT_NE(out.find("Cache server startup completed successfully!"), std::string::npos)
      << out;
  EXPECT_NE(out.find(fmt::format("process id {}", server.pid())), std::string::npos)
      << out;
  EXPECT_EQ(out.find("listening on port"), std::string::npos) << out;
  EXPECT_NE(out.find("for port " + port +
                     ", which names the instance: no TCP port is "
                     "opened"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("Unix socket " + server.socket_path()), std::string::npos) << out;
  EXPECT_NE(out.find("run dir " + server.run_dir()), std::string::npos) << out;
  EXPECT_NE(out.find("shared memory in " + server.shm_dir()), std::string::npos) << out;
  EXPECT_NE(out.find("Stop it with 'shmcache --stop -p " + port + "'"), std::string::npos)
      << out;
}

// --list_sessions shows each cache's name, last (a name may be long), on
// its cache's line; a name's control characters are escaped, so that a
// cache stays one line of the table.
TEST_F(CliTest, ListSessionsNamesEachCache) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  const uint32_t session = server.NewSession();
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  std::vector<std::unique_ptr<Cache>> caches;
  for (const char* name : {"train", "val set", "two\nlines"}) {
    caches.emplace_back();
    ASSERT_TRUE(
        client->OpenCache(CacheNamed(session, name, 0, false), &caches.back()).ok())
        << name;
  }
  CommandResult list = server.Admin({"--list_sessions"});
  ASSERT_EQ(list.exit_code, 0) << list.Describe();
  std::vector<std::string> lines;
  std::istringstream in(list.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  // The title, a blank line, the header and one line per cache.
  ASSERT_EQ(lines.size(), 3 + caches.size()) << list.out;
  EXPECT_TRUE(lines[2].ends_with("Full  Name")) << lines[2];
  const char* shown[] = {"train", "val set", "two\\nlines"};
  for (size_t i = 0; i < caches.size(); ++i) {
    const std::string ids = fmt::format(" {} +{} ", session, caches[i]->cache_id());
    auto line = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) {
      return std::regex_search(l, std::regex(ids));
    });
    ASSERT_NE(line, lines.end()) << ids << "\n" << list.out;
    EXPECT_TRUE(line->ends_with(std::string("no  ") + shown[i])) << *line;
  }
}

TEST_F(CliTest, StartPrintsALogPathWithSpacesWhole) {
  std::string logs = run_dir_ + "/my logs";
  TestServer server(WithArgs({"--log_dir", logs}));
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  const std::string& out = server.start_result().out;
  size_t at = out.find("Logs: ");
  ASSERT_NE(at, std::string::npos) << out;
  std::string path = out.substr(at + 6, out.find('\n', at) - at - 6);
  EXPECT_EQ(path.rfind(logs + "/shmcached.", 0), 0u) << out;
  EXPECT_TRUE(PathExists(path)) << path;
}

TEST_F(CliTest, SecondStartOfTheSameInstance) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  CommandResult r = server.Admin({"--start", "--shm_dir", server.shm_dir()});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("already running on port " + std::to_string(server.port())),
            std::string::npos)
      << r.Describe();
  EXPECT_NE(r.err.find(std::to_string(server.pid())), std::string::npos) << r.Describe();
  // The first server is unharmed.
  CommandResult g = server.Admin({"-g"});
  EXPECT_EQ(g.exit_code, 0) << g.Describe();
}

TEST_F(CliTest, PortFromTheEnvironment) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  Env env = server.AdminEnv();
  env.emplace_back("SHMCACHE_PORT", std::to_string(server.port()));
  CommandResult g = RunCommand({AdminPath(), "-g"}, env);
  ASSERT_EQ(g.exit_code, 0) << g.Describe();
  CommandResult info = RunCommand({AdminPath(), "--server_info", "--json"}, env);
  ASSERT_EQ(info.exit_code, 0) << info.Describe();
  EXPECT_EQ(std::to_string(ParseJson(info.out).at("sessions").front().get<uint32_t>()),
            LastToken(g.out));
  // The local host names are accepted.
  for (const char* h : {"127.0.0.1", "localhost", "::1"}) {
    CommandResult r = server.Admin({"--server_info", "-h", h});
    EXPECT_EQ(r.exit_code, 0) << h << r.Describe();
  }
}

TEST_F(CliTest, TwoInstancesSideBySide) {
  // The same run dir and shm dir, two ports.
  TempDir shm_dir("/dev/shm");
  const std::string& shm = shm_dir.path();
  ServerOptions o;
  o.run_dir = run_dir_;
  o.shm_dir = shm;
  {
    TestServer a(o);
    TestServer b(o);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(b.ok());
    ASSERT_NE(a.port(), b.port());
    ASSERT_NE(a.pid(), b.pid());
    std::string sa = LastToken(a.Admin({"-g"}).out);
    std::string sb = LastToken(b.Admin({"-g"}).out);
    Json ia = ParseJson(a.Admin({"--server_info", "--json"}).out);
    Json ib = ParseJson(b.Admin({"--server_info", "--json"}).out);
    EXPECT_EQ(ia.at("port").get<int>(), a.port());
    EXPECT_EQ(ib.at("port").get<int>(), b.port());
    ASSERT_EQ(ia.at("sessions").size(), 1u);
    ASSERT_EQ(ib.at("sessions").size(), 1u);
    EXPECT_EQ(std::to_string(ia.at("sessions").front().get<uint32_t>()), sa);
    EXPECT_EQ(std::to_string(ib.at("sessions").front().get<uint32_t>()), sb);
    // Stopping one leaves the other running, with its files.
    ASSERT_EQ(a.Stop().exit_code, 0);
    EXPECT_TRUE(a.ShmFiles().empty());
    EXPECT_FALSE(b.ShmFiles().empty());
    CommandResult gb = b.Admin({"-g"});
    EXPECT_EQ(gb.exit_code, 0) << gb.Describe();
  }
  EXPECT_TRUE(ListDir(shm).empty()) << testing::PrintToString(ListDir(shm));
}

int Mode(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

// The server's log file and every directory made for it are owner-only.
void ExpectOwnerOnlyLog(const TestServer& server, const std::string& log_dir,
                        const std::string& made_from) {
  Json si = ParseJson(server.Admin({"--server_info", "--json"}).out);
  const std::string log = si.at("log_file").get<std::string>();
  EXPECT_EQ(log.rfind(log_dir + "/shmcached.", 0), 0u) << log;
  EXPECT_EQ(Mode(log), 0600) << log;
  for (std::string d = log_dir; d.size() > made_from.size();
       d = d.substr(0, d.rfind('/'))) {
    EXPECT_EQ(Mode(d), 0700) << d;
  }
}

TEST_F(CliTest, LogsAreOwnerOnly) {
  {  // By default, in the run dir, which is the user's own.
    ServerOptions o;
    o.default_log_dir = true;
    TestServer server(o);
    ASSERT_TRUE(server.ok());
    ExpectOwnerOnlyLog(server, server.run_dir() + "/log", server.run_dir());
  }
  {  // A --log_dir that cannot be made: the server logs in its run dir, and
     // --start says so rather than leave the user looking in the wrong place.
    const std::string file = run_dir_ + "/a-file";
    close(open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    ServerOptions o;
    o.default_log_dir = true;
    o.extra_args = {"--log_dir", file + "/log"};
    TestServer server(o);
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    const std::string& out = server.start_result().out;
    EXPECT_NE(out.find("Warning: log directory " + file + "/log cannot be used ("),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("); logging in " + server.run_dir() + "/log instead"),
              std::string::npos)
        << out;
    ExpectOwnerOnlyLog(server, server.run_dir() + "/log", server.run_dir());
  }
  {  // A --log_dir that does not exist yet is made owner-only.
    TempDir parent_dir(TestTmpRoot());
    const std::string& parent = parent_dir.path();
    TestServer server(WithArgs({"--log_dir", parent + "/a/b"}));
    ASSERT_TRUE(server.ok());
    ExpectOwnerOnlyLog(server, parent + "/a/b", parent);
  }
}

TEST_F(CliTest, SocketPathTooLongIsRefusedBeforeAnythingIsMade) {
  const std::string run = run_dir_ + "/" + std::string(120, 'r');
  TempDir shm_dir("/dev/shm");
  const std::string& shm = shm_dir.path();
  CommandResult r = RunCommand(
      {AdminPath(), "--start", "--shm_dir", shm, "-p", "23456"},
      {{"SHMCACHE_RUN_DIR", run}, {"SHMCACHE_WATCH_PID", std::to_string(getpid())}});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("longer than the 107 the system allows; use a shorter "
                       "SHMCACHE_RUN_DIR"),
            std::string::npos)
      << r.Describe();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(ListDir(shm).empty()) << testing::PrintToString(ListDir(shm));
  EXPECT_FALSE(PathExists(run));
}

// A relative SHMCACHE_RUN_DIR would put the socket under the directory the
// server was started in, where no client elsewhere looks ("not running");
// a relative SHMCACHE_SHM_DIR would hand clients file paths that resolve
// only there ("session does not exist"). Both are refused, naming the
// variable, before anything is made; clients refuse the run dir too.
TEST_F(CliTest, RelativeRunOrShmDirIsRefusedBeforeAnythingIsMade) {
  const std::string cwd = MakeTempDir(run_dir_, "cwd");
  ASSERT_EQ(mkdir((cwd + "/shm").c_str(), 0700), 0);
  const std::string watch = std::to_string(getpid());
  // The admin run from `cwd`, as a user in another directory would run it.
  auto run_in_cwd = [&](const std::vector<std::string>& args, const Env& env) {
    std::string cmd = "cd '" + cwd + "' && exec '" + AdminPath() + "'";
    for (const std::string& a : args) cmd += " " + a;
    return RunCommand({"/bin/sh", "-c", cmd}, env);
  };
  struct Case {
    Env env;
    std::string what;
  };
  const Case cases[] = {
      {{{"SHMCACHE_RUN_DIR", "run"}, {"SHMCACHE_WATCH_PID", watch}},
       "run dir 'run' (SHMCACHE_RUN_DIR) is not an absolute path"},
      {{{"SHMCACHE_RUN_DIR", run_dir_},
        {"SHMCACHE_SHM_DIR", "shm"},
        {"SHMCACHE_WATCH_PID", watch}},
       "shared-memory directory 'shm' (SHMCACHE_SHM_DIR) is not an absolute path"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    CommandResult r = run_in_cwd({"--start", "-p", "23457"}, c.env);
    if (r.exit_code == 0) run_in_cwd({"--stop", "-p", "23457"}, c.env);  // old code
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_NE(r.err.find(c.what), std::string::npos) << r.Describe();
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("shmcache: error: ", 0), 0u) << r.err;
  }
  EXPECT_FALSE(PathExists(cwd + "/run"));
  EXPECT_TRUE(ListDir(cwd + "/shm").empty())
      << testing::PrintToString(ListDir(cwd + "/shm"));
  for (const char* cmd : {"-g", "--list_sessions", "--stop"}) {
    CommandResult r = run_in_cwd({cmd, "-p", "23457"}, {{"SHMCACHE_RUN_DIR", "run"}});
    EXPECT_EQ(r.exit_code, 1) << cmd << r.Describe();
    EXPECT_NE(r.err.find("run dir 'run' (SHMCACHE_RUN_DIR) is not an absolute path"),
              std::string::npos)
        << cmd << r.Describe();
  }
}

// An empty SHMCACHE_RUN_DIR or SHMCACHE_SHM_DIR (a variable a script never
// set) is refused as an empty --shm_dir and an empty SHMCACHE_PORT are,
// naming the variable, by every command that reads it: it was read as
// unset, so a job meant to have a run dir of its own shared the default
// one, and --stop counted a killed server's files in no directory at all
// (a relative SHMCACHE_SHM_DIR, refused at --start, was read there too).
TEST_F(CliTest, AnEmptyRunOrShmDirIsRefusedAsAnEmptyFlagIs) {
  const std::string watch = std::to_string(getpid());
  const std::string empty_run =
      "run dir '' (SHMCACHE_RUN_DIR) is not an absolute path (it is empty); set "
      "SHMCACHE_RUN_DIR to an absolute directory, or unset it for /tmp/shmcache-" +
      std::to_string(geteuid());
  const std::string empty_shm =
      "shared-memory directory '' (SHMCACHE_SHM_DIR) is not an absolute path (it is "
      "empty); set SHMCACHE_SHM_DIR to an absolute directory, or unset it for /dev/shm";
  for (const char* cmd : {"--start", "-g", "--list_sessions", "--stop"}) {
    // Not Run(), which sets this test's run dir.
    const Env env = {{"SHMCACHE_RUN_DIR", ""}, {"SHMCACHE_WATCH_PID", watch}};
    CommandResult r = RunCommand({AdminPath(), cmd, "-p", "23462"}, env);
    if (r.exit_code == 0 && std::string(cmd) == "--start") {  // the old code started one
      RunCommand({AdminPath(), "--stop", "-p", "23462"}, env);
    }
    SCOPED_TRACE(cmd);
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_NE(r.err.find(empty_run), std::string::npos) << r.Describe();
  }
  for (const char* cmd : {"--start", "--stop"}) {
    const Env env = {{"SHMCACHE_SHM_DIR", ""}, {"SHMCACHE_WATCH_PID", watch}};
    CommandResult r = Run({cmd, "-p", "23462"}, env);
    if (r.exit_code == 0 && std::string(cmd) == "--start") {
      Run({"--stop", "-p", "23462"}, env);
    }
    SCOPED_TRACE(cmd);
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_NE(r.err.find(empty_shm), std::string::npos) << r.Describe();
  }
  ExpectError({"--stop", "-p", "23462"},
              "shared-memory directory 'shm' (SHMCACHE_SHM_DIR) is not an absolute path",
              {{"SHMCACHE_SHM_DIR", "shm"}});
}

// A run or shm dir from the environment with white space around it (a
// quoting slip) is refused saying so, as --shm_dir's value is: one that
// ended in a space was "not writable: No such file or directory" (the
// space unseen in the message) or "not running", one that began with it
// "not an absolute path" without the reason.
TEST_F(CliTest, AnEnvironmentDirWithWhiteSpaceAroundItSaysSo) {
  const Env watch = {{"SHMCACHE_WATCH_PID", std::to_string(getpid())}};
  auto with = [&](const std::string& var, const std::string& value) {
    Env env = watch;
    env.emplace_back(var, value);
    return env;
  };
  ExpectError({"--start", "-p", "23463"},
              "shared-memory directory '/dev/shm ' (SHMCACHE_SHM_DIR) ends in white "
              "space; set SHMCACHE_SHM_DIR to the path without it",
              with("SHMCACHE_SHM_DIR", "/dev/shm "));
  ExpectError({"--start", "-p", "23463"},
              "shared-memory directory ' /dev/shm' (SHMCACHE_SHM_DIR) is not an absolute "
              "path (white space before it)",
              with("SHMCACHE_SHM_DIR", " /dev/shm"));
  for (const char* cmd : {"--start", "-g"}) {
    SCOPED_TRACE(cmd);
    CommandResult r = RunCommand({AdminPath(), cmd, "-p", "23463"},
                                 with("SHMCACHE_RUN_DIR", run_dir_ + "/run "));
    if (r.exit_code == 0 && std::string(cmd) == "--start") {  // the old code started one
      RunCommand({AdminPath(), "--stop", "-p", "23463"},
                 with("SHMCACHE_RUN_DIR", run_dir_ + "/run "));
    }
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_NE(r.err.find("run dir '" + run_dir_ +
                         "/run ' (SHMCACHE_RUN_DIR) ends in white space; set "
                         "SHMCACHE_RUN_DIR to the path without it"),
              std::string::npos)
        << r.Describe();
  }
  EXPECT_FALSE(PathExists(run_dir_ + "/run "));
}

// A file given as the shm dir is named as what it is ("not writable:
// Permission denied" before; one root may execute passed that check).
TEST_F(CliTest, AShmDirThatIsAFileIsNamedSo) {
  const std::string file = run_dir_ + "/segments";
  { std::ofstream(file) << "x"; }
  for (mode_t mode : {0644, 0755}) {
    ASSERT_EQ(chmod(file.c_str(), mode), 0);
    ExpectError(
        {"--start", "-p", "23461", "--shm_dir", file},
        "shared-memory directory " + file +
            " is not a directory; give --shm_dir (or SHMCACHE_SHM_DIR) a directory, "
            "on a tmpfs",
        {{"SHMCACHE_WATCH_PID", std::to_string(getpid())}});
    // A start refused leaves no lock file behind, here or in /dev/shm.
    EXPECT_FALSE(PathExists(run_dir_ + "/shmcached-23461.lock"));
    EXPECT_FALSE(PathExists(HostLockPath(23461)));
  }
}

// A spill dir where the server cannot make its database (/proc: not even
// root creates a file there) fails the start after the lock files were
// taken: with nothing of the instance in the shm dir they go too (a
// refused start left its host lock in /dev/shm for good before).
TEST_F(CliTest, AStartRefusedAfterItsLocksLeavesNoLockFile) {
  CommandResult r = Run({"--start", "-p", "23463", "--spilldir", "/proc"},
                        {{"SHMCACHE_WATCH_PID", std::to_string(getpid())}});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("cannot create /proc/"), std::string::npos) << r.Describe();
  EXPECT_FALSE(PathExists(run_dir_ + "/shmcached-23463.lock"));
  EXPECT_FALSE(PathExists(HostLockPath(23463)));
}

// A watched process already gone: the start is refused, rather than
// reported a success by a server that stops 200 ms later.
TEST_F(CliTest, AWatchedProcessAlreadyGoneIsRefused) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: its pid names no process
  TempDir shm_dir("/dev/shm");
  const std::string& shm = shm_dir.path();
  ExpectError({"--start", "-p", "23459", "--shm_dir", shm},
              "the process to watch (SHMCACHE_WATCH_PID, --watch_pid) " +
                  std::to_string(child) + " is not running",
              {{"SHMCACHE_WATCH_PID", std::to_string(child)}});
  EXPECT_TRUE(ListDir(shm).empty()) << testing::PrintToString(ListDir(shm));
}

TEST_F(CliTest, StartWithOptionsIsReported) {
  std::string spill = MakeTempDir(run_dir_, "spill");
  ServerOptions o;
  o.extra_args = {"-w", "3", "-l", "2", "-s", spill};
  TestServer server(o);
  ASSERT_TRUE(server.ok());
  EXPECT_NE(server.start_result().out.find("Workers: 3"), std::string::npos)
      << server.start_result().out;
  Json si = ParseJson(server.Admin({"--server_info", "--json"}).out);
  EXPECT_EQ(si.at("workers").get<int>(), 3);
  EXPECT_EQ(si.at("log_level").get<int>(), 2);
  EXPECT_EQ(si.at("spill_dir").get<std::string>(), spill);
}

}  // namespace
}  // namespace shmcache::test
