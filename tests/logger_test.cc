// The daemon's log file (daemon/logger.h): owner-only, made where asked,
// and rotated past its size with nothing lost and no link followed.
#include "daemon/logger.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/support/test_server.h"

namespace shmcache {
namespace {

int Mode(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class LoggerTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::MakeTempDir(test::TestTmpRoot(), "logger"); }
  void TearDown() override { test::RemoveTree(dir_); }
  std::string dir_;
};

TEST_F(LoggerTest, MakesOwnerOnlyDirectoriesAndFile) {
  Logger log;
  ASSERT_TRUE(log.Open(dir_ + "/a/b", 1).ok());
  EXPECT_EQ(log.path().rfind(dir_ + "/a/b/shmcached.", 0), 0u) << log.path();
  EXPECT_EQ(Mode(dir_ + "/a"), 0700);
  EXPECT_EQ(Mode(dir_ + "/a/b"), 0700);
  EXPECT_EQ(Mode(log.path()), 0600);
  log.Info("hello {}", 42);
  log.Debug("not at level 1");
  std::vector<std::string> lines = Lines(log.path());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(" I " + std::to_string(getpid()) + " hello 42"),
            std::string::npos)
      << lines[0];
}

TEST_F(LoggerTest, ADirectoryInTheWayIsAnError) {
  { std::ofstream(dir_ + "/file") << "x"; }
  Logger log;
  Status s = log.Open(dir_ + "/file/log", 1);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot create log directory " + dir_ + "/file"),
            std::string::npos)
      << s.ToString();
}

// A link (or anything) at the name a log file is about to take, in a log
// dir others may write: never opened, never followed; the open fails.
TEST_F(LoggerTest, ALogFileNameTakenIsNeverOpened) {
  const std::string target = dir_ + "/target";
  { std::ofstream(target) << "theirs\n"; }
  // The name holds the host, the user, the pid and the start second: take
  // it for the seconds the open may fall in.
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const passwd* pw = getpwuid(geteuid());
  const std::string user = pw != nullptr ? pw->pw_name : std::to_string(geteuid());
  std::vector<std::string> planted;
  const time_t now = time(nullptr);
  for (time_t t = now; t < now + 5; ++t) {
    tm local;
    localtime_r(&t, &local);
    char date[32];
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", &local);
    planted.push_back(
        fmt::format("{}/shmcached.{}.{}.{}.{}.log", dir_, host, user, getpid(), date));
    ASSERT_EQ(symlink(target.c_str(), planted.back().c_str()), 0);
  }
  Logger log;
  Status s = log.Open(dir_, 1);
  ASSERT_LT(time(nullptr), now + 5) << "the open took longer than the names planted";
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot create log file"), std::string::npos)
      << s.ToString();
  log.Info("not written anywhere");
  EXPECT_EQ(Lines(target), std::vector<std::string>{"theirs"});
}

TEST_F(LoggerTest, RotatesPastItsSizeLosingNothingRecent) {
  Logger log;
  ASSERT_TRUE(log.Open(dir_, 1, /*rotate_bytes=*/400).ok());
  const std::string old = log.path() + ".1";
  // Planted where the rotated file goes: replaced, never written through.
  std::string victim = dir_ + "/victim";
  { std::ofstream(victim) << "untouched\n"; }
  ASSERT_EQ(symlink(victim.c_str(), old.c_str()), 0);
  for (int i = 0; i < 40; ++i) log.Warn("line {:02d} of the log", i);

  EXPECT_EQ(Lines(victim), std::vector<std::string>{"untouched"});
  EXPECT_EQ(Mode(old), 0600) << "a file of its own, not the link";
  EXPECT_EQ(Mode(log.path()), 0600);
  std::vector<std::string> lines = Lines(old);
  std::vector<std::string> now = Lines(log.path());
  EXPECT_FALSE(lines.empty());
  lines.insert(lines.end(), now.begin(), now.end());
  // The last lines, in order, the newest in the current file.
  ASSERT_GE(lines.size(), 2u);
  int first = 40 - static_cast<int>(lines.size());
  for (size_t k = 0; k < lines.size(); ++k) {
    std::string want = "line " + fmt::format("{:02d}", first + static_cast<int>(k));
    EXPECT_NE(lines[k].find(want), std::string::npos) << k << ": " << lines[k];
  }
  struct stat st;
  ASSERT_EQ(stat(log.path().c_str(), &st), 0);
  EXPECT_LT(st.st_size, 400);
}

}  // namespace
}  // namespace shmcache
