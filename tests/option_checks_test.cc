// option_checks.h: the one reading of the values the admin's --start and
// shmcached share. Each value is taken or refused with one line naming the
// value and the valid range, the same from both binaries.
#include "common/option_checks.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "format/instance.h"
#include "shmcache/options.h"
#include "tests/support/test_server.h"

namespace shmcache {
namespace {

using test::TempDir;
using test::TestTmpRoot;

// The message of a refusal, or "OK".
std::string Why(const Status& s) {
  if (s.ok()) return "OK";
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  return s.message();
}

TEST(OptionChecksTest, NumbersInRangeAreTaken) {
  uint32_t id = 0;
  EXPECT_EQ(Why(ParseSessionId("4294967295", 0, &id)), "OK");
  EXPECT_EQ(id, 4294967295u);
  EXPECT_EQ(Why(ParseSessionId("1", 0, &id)), "OK");
  EXPECT_EQ(id, 1u);
  int n = 0;
  EXPECT_EQ(Why(ParseWorkers("512", &n)), "OK");
  EXPECT_EQ(n, 512);
  EXPECT_EQ(Why(ParseLogLevel("0", &n)), "OK");
  EXPECT_EQ(n, 0);
  EXPECT_EQ(Why(ParseMetricsInterval("3600", &n)), "OK");
  EXPECT_EQ(n, 3600);
  uint64_t bytes = 0;
  EXPECT_EQ(Why(ParseMemoryCapMb("3", &bytes)), "OK");
  EXPECT_EQ(bytes, 3u << 20);
  // Decimal, as strtol read them: "010" is ten, not octal eight.
  EXPECT_EQ(Why(ParseWorkers("010", &n)), "OK");
  EXPECT_EQ(n, 10);
}

TEST(OptionChecksTest, NumbersOutOfRangeNameTheValueAndTheRange) {
  uint32_t id = 7;
  EXPECT_EQ(Why(ParseSessionId("4294967296", 0, &id)),
            "session id '4294967296' is not a number in 1..4294967295, as 'shmcache -g' "
            "prints; list the sessions with 'shmcache --list_sessions'");
  EXPECT_EQ(Why(ParseSessionId("-5", kDefaultPort, &id)),
            "session id '-5' is not a number in 1..4294967295, as 'shmcache -g' prints; "
            "list the sessions with 'shmcache --list_sessions'");
  EXPECT_EQ(Why(ParseSessionId("0", 0, &id)),
            "session id 0 is no session: ids are 1..4294967295, as 'shmcache -g' prints "
            "(a launcher that could not create a session exports 0); list the sessions "
            "with 'shmcache --list_sessions'");
  // Another port's sessions are listed and created with -p.
  EXPECT_EQ(Why(ParseSessionId("x", 51999, &id)),
            "session id 'x' is not a number in 1..4294967295, as 'shmcache -g -p 51999' "
            "prints; list the sessions with 'shmcache --list_sessions -p 51999'");
  EXPECT_EQ(id, 7u) << "a refused value stores nothing";
  int n = 7;
  // Each range says what to give instead.
  const std::string workers_fix =
      "; give -w (--workers) a whole number of threads in 1..512, or leave it out for "
      "half the CPUs";
  EXPECT_EQ(Why(ParseWorkers("0", &n)),
            "worker count '0' is not a number in 1..512" + workers_fix);
  EXPECT_EQ(Why(ParseWorkers("two", &n)),
            "worker count 'two' is not a number in 1..512" + workers_fix);
  EXPECT_EQ(Why(ParseLogLevel("info", &n)),
            "log level 'info' is not a number in 0..4; give -l (--loglevel) 0 (debug), 1 "
            "(info, the default), 2 (warning), 3 (error) or 4 (fatal)");
  EXPECT_EQ(Why(ParseMetricsInterval("0", &n)),
            "metrics interval '0' is not a number of seconds in 1..3600; give "
            "--metrics_interval a whole number of seconds in 1..3600, or leave it out "
            "for 5");
  EXPECT_EQ(n, 7);
  uint64_t bytes = 0;
  EXPECT_EQ(Why(ParseMemoryCapMb("0", &bytes)),
            "memory cap '0' is not a positive number of MB: give a whole number of MB, "
            "without a unit (--memory_cap_mb 4096 for 4 GB)");
  long v = 0;
  EXPECT_EQ(Why(ParseInRange("--ready_fd", "x", 0, 9, &v)),
            "--ready_fd 'x' is not a number in 0..9");
}

TEST(OptionChecksTest, MemoryCapRatioIsAShareOfMemory) {
  for (const char* ok : {"0.5", "1", "1e-300", ".25", "5e-1"}) {
    double r = 0;
    EXPECT_EQ(Why(ParseMemoryCapRatio(ok, &r)), "OK") << ok;
    EXPECT_EQ(r, std::strtod(ok, nullptr)) << ok;
  }
  for (const char* bad : {"0", "1.5", "-0.5", "abc", "0.5x", "nan", "inf"}) {
    double r = 0;
    EXPECT_EQ(Why(ParseMemoryCapRatio(bad, &r)),
              std::string("memory cap ratio '") + bad +
                  "' is not a number in (0, 1]; give -r (--memory_cap_ratio) a share of "
                  "memory such as 0.5 (default 0.8), or --memory_cap_mb N for a size in "
                  "MB");
  }
  // As typed: what strtod forgave (white space, a '+') is a quoting slip.
  for (const auto& [bad, why] :
       {std::pair{" 0.5", "white space before it"},
        std::pair{"0.5 ", "white space after it"}, std::pair{"+0.5", "a '+' sign"},
        std::pair{"+-1", "a '+' sign"}, std::pair{"", "it is empty"}}) {
    double r = 0;
    EXPECT_EQ(Why(ParseMemoryCapRatio(bad, &r))
                  .rfind(fmt::format(
                      "memory cap ratio '{}' is not a number in (0, 1] ({}); give -r",
                      bad, why)),
              0u);
    EXPECT_EQ(r, 0) << bad;
  }
}

// A number as typed: digits alone. strtol took white space before it and a
// '+', and the admin read `-d " 12"` as session 12.
TEST(OptionChecksTest, NumbersAreTakenAsTyped) {
  const std::pair<const char*, const char*> flaws[] = {{" 12", "white space before it"},
                                                       {"\t12", "white space before it"},
                                                       {"12 ", "white space after it"},
                                                       {"12\n", "white space after it"},
                                                       {"+12", "a '+' sign"},
                                                       {"", "it is empty"}};
  for (const auto& [text, why] : flaws) {
    SCOPED_TRACE(testing::PrintToString(text));
    uint32_t id = 7;
    EXPECT_EQ(Why(ParseSessionId(text, 0, &id)),
              fmt::format("session id '{}' is not a number in 1..4294967295 ({}), as "
                          "'shmcache -g' prints; list the sessions with 'shmcache "
                          "--list_sessions'",
                          text, why));
    EXPECT_EQ(id, 7u);
    int n = 7;
    EXPECT_EQ(Why(ParseWorkers(text, &n)),
              fmt::format("worker count '{}' is not a number in 1..512 ({}); give -w "
                          "(--workers) a whole number of threads in 1..512, or leave it "
                          "out for half the CPUs",
                          text, why));
    EXPECT_NE(Why(ParseLogLevel(text, &n)).find(fmt::format("0..4 ({});", why)),
              std::string::npos);
    EXPECT_NE(Why(ParseMetricsInterval(text, &n)).find(fmt::format("1..3600 ({});", why)),
              std::string::npos);
    EXPECT_EQ(n, 7);
    uint64_t bytes = 0;
    EXPECT_NE(Why(ParseMemoryCapMb(text, &bytes)).find(fmt::format("of MB ({}):", why)),
              std::string::npos);
    long v = 0;
    EXPECT_EQ(Why(ParseInRange("--ready_fd", text, 0, 99, &v)),
              fmt::format("--ready_fd '{}' is not a number in 0..99 ({})", text, why));
    int port = 0;
    EXPECT_EQ(Why(ParsePort(text, &port))
                  .rfind(fmt::format("port '{}' is not a number in 1025..65535 ({}); use",
                                     text, why)),
              0u);
  }
  // Out of range or no number: the range says it, with no note.
  long v = 0;
  EXPECT_EQ(Why(ParseInRange("n", "99999999999999999999", 0, 9, &v)),
            "n '99999999999999999999' is not a number in 0..9");
  EXPECT_EQ(Why(ParseInRange("n", "-1", 0, 9, &v)), "n '-1' is not a number in 0..9");
  EXPECT_EQ(Why(ParseInRange("n", "1x", 0, 9, &v)), "n '1x' is not a number in 0..9");
}

TEST(OptionChecksTest, MemoryCapBelowOneSegmentNamesTheOption) {
  EXPECT_EQ(Why(CheckMemoryCap(0.8, 4u << 20)), "OK");
  EXPECT_EQ(Why(CheckMemoryCap(0.8, 3u << 20)),
            "memory cap of 3 MB is below one segment (4 MB); give --memory_cap_mb 4 "
            "or more");
  EXPECT_NE(
      Why(CheckMemoryCap(1e-300, 0)).find("below one segment (4 MB); use a larger -r"),
      std::string::npos);
  EXPECT_EQ(MemoryCapBytes(0.5, 123), 123u) << "an absolute cap wins over the ratio";
}

TEST(OptionChecksTest, PathsMustBeAbsolute) {
  EXPECT_EQ(Why(CheckAbsolutePath("log directory", "/x")), "OK");
  EXPECT_EQ(Why(CheckAbsolutePath("log directory", "/x y")), "OK");
  EXPECT_EQ(Why(CheckAbsolutePath("log directory", "/x ")),
            "log directory '/x ' ends in white space; give the path without it");
  EXPECT_EQ(Why(CheckAbsolutePath("log directory", " /x")),
            "log directory ' /x' is not an absolute path (white space before it); give "
            "one that starts with /");
  EXPECT_EQ(Why(CheckAbsolutePath("log directory", "x")),
            "log directory 'x' is not an absolute path; give one that starts with /");
  EXPECT_EQ(Why(CheckAbsolutePath("shared-memory directory", "")),
            "shared-memory directory '' is not an absolute path (it is empty); give one "
            "that starts with /");
}

TEST(OptionChecksTest, SpillDirMustExistAndBeWritable) {
  TempDir tmp(TestTmpRoot());
  const std::string& dir = tmp.path();
  EXPECT_EQ(Why(CheckSpillDir(dir)), "OK");
  EXPECT_EQ(
      Why(CheckSpillDir("relative/dir")),
      "spill directory 'relative/dir' is not an absolute path; give one that starts "
      "with /");
  EXPECT_EQ(
      Why(CheckSpillDir(dir + "/missing")),
      "spill directory " + dir + "/missing does not exist; create it first (mkdir -p)");
  // A file given as the directory: named as what it is (root, who may
  // write it, was told "not writable").
  const std::string file = dir + "/rows.bin";
  { std::ofstream(file) << "x"; }
  EXPECT_EQ(Why(CheckSpillDir(file)),
            "spill directory " + file + " is not a directory; give -s a directory");
  if (geteuid() != 0) {  // root writes anywhere
    ASSERT_EQ(chmod(dir.c_str(), 0555), 0);
    EXPECT_EQ(Why(CheckSpillDir(dir)), "spill directory " + dir +
                                           " is not writable by this user; give -s a "
                                           "directory it can write");
    chmod(dir.c_str(), 0755);
  }
}

TEST(OptionChecksTest, MetricsFileMustBeAFileInAnExistingDirectory) {
  TempDir tmp(TestTmpRoot());
  const std::string& dir = tmp.path();
  EXPECT_EQ(Why(CheckMetricsFile(dir + "/shmcache.prom")), "OK");
  EXPECT_EQ(Why(CheckMetricsFile("shmcache.prom")),
            "metrics file 'shmcache.prom' is not an absolute file path");
  EXPECT_EQ(Why(CheckMetricsFile(dir + "/")),
            "metrics file '" + dir + "/' is not an absolute file path");
  EXPECT_EQ(Why(CheckMetricsFile(dir + "/no/shmcache.prom")),
            "metrics file directory " + dir + "/no does not exist; create it first");
  EXPECT_EQ(Why(CheckMetricsFile(dir)), "metrics file " + dir + " is a directory");
}

TEST(OptionChecksTest, AMetricsFileNameLeavesRoomForItsTemporaryFile) {
  TempDir tmp(TestTmpRoot());
  const std::string& dir = tmp.path();
  EXPECT_EQ(Why(CheckMetricsFile(dir + "/" + std::string(242, 'm'))), "OK");
  std::string why = Why(CheckMetricsFile(dir + "/" + std::string(250, 'm')));
  EXPECT_NE(why.find("metrics file name has 250 bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("at most 242 bytes"), std::string::npos) << why;
}

// Another user's file in a sticky directory cannot be replaced by rename:
// the server would never write its metrics there.
TEST(OptionChecksTest, AnotherUsersMetricsFileInAStickyDirectoryIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as two users";
  // Under /tmp: the other user must reach it.
  TempDir tmp("/tmp");
  const std::string& dir = tmp.path();
  ASSERT_EQ(chmod(dir.c_str(), 01777), 0);
  std::string path = dir + "/shmcache.prom";
  { std::ofstream(path) << "# root's\n"; }  // root's file, 0644
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    std::string why = CheckMetricsFile(path).message();
    bool named =
        why.find("belongs to uid 0 in the sticky directory") != std::string::npos;
    bool free_name = CheckMetricsFile(dir + "/other.prom").ok();
    _exit(named && free_name ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(OptionChecksTest, WorkersAreHalfTheCpusRoundedUpToTheNodes) {
  EXPECT_EQ(WorkerCount(3, 64, 2), 4);
  EXPECT_EQ(WorkerCount(4, 64, 2), 4);
  EXPECT_EQ(WorkerCount(5, 64, 1), 5);
  EXPECT_EQ(WorkerCount(0, 8, 1), 4) << "half the CPUs";
  EXPECT_EQ(WorkerCount(0, 1, 1), 1) << "at least one";
  EXPECT_EQ(WorkerCount(0, 3, 2), 2);
  EXPECT_EQ(WorkerCount(0, 16, 4), 8);
  EXPECT_EQ(WorkerCount(3, 16, 0), 3) << "no node count: one node";
}

}  // namespace
}  // namespace shmcache
