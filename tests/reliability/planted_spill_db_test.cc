// The spill database, DIR/shmcache.<uid>.<port>.spill, in a spill dir other
// users may write (a shared, sticky scratch dir): created 0700 by the
// server's user, so nobody else reads spilled rows from its WAL and table
// files; and whatever someone else put at its name (her directory, a link
// to a third user's directory) or on the way to it is refused before
// RocksDB sees the path, never opened, filled or destroyed through.
// Issue 32, items 3 and 4. Cases that give a file to another uid need
// root and skip otherwise.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "shmcache/stats.h"
#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

constexpr uid_t kNobody = 65534;
constexpr uid_t kThirdUser = 65533;  // a uid that is neither ours nor nobody's
constexpr uint64_t kRows = 800;      // 800 x ~3 KB: past a 1 MB budget

// A shared spill dir, as /tmp is: world-writable and sticky.
class SharedSpillDir : public TempDir {
 public:
  SharedSpillDir() { chmod(path().c_str(), 01777); }
};

std::string DbPath(const std::string& dir, const TestDaemon& d) {
  return fmt::format("{}/shmcache.{}.{}.spill", dir, geteuid(), d.port());
}

TestDaemon::Options Spilling(const std::string& dir) {
  TestDaemon::Options o;
  o.extra_args = {"--spilldir=" + dir};
  return o;
}

// Rows past a 1 MB budget: some spill. Returns the rows on disk.
uint64_t SpillSome(const TestDaemon& d) {
  SessionCache sc;
  Status s = Client::Connect(d.client_options(), &sc.client);
  if (s.ok()) s = sc.client->CreateSession(&sc.session);
  if (s.ok()) {
    s = sc.client->OpenCache({.session_id = sc.session,
                              .fingerprint = "spill",
                              .size_mb = 1,
                              .spill_requested = true},
                             &sc.cache);
  }
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return 0;
  RowMaker m(3072);
  for (uint64_t id = 0; id < kRows; ++id) EXPECT_TRUE(m.Put(*sc.cache, id).ok()) << id;
  CacheStats st;
  EXPECT_TRUE(sc.cache->GetStats(&st).ok());
  return st.disk_rows;
}

TEST(SpillDb, IsOwnerOnlyAndAnotherUserReadsNoRow) {
  SharedSpillDir dir;
  TestDaemon d;
  ASSERT_TRUE(d.Start(Spilling(dir.path())).ok());
  EXPECT_GT(SpillSome(d), 0u);
  const std::string db = DbPath(dir.path(), d);
  struct stat st {};
  ASSERT_EQ(lstat(db.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(st.st_mode & 07777, 0700u) << db << " is open to others";
  if (geteuid() == 0) {
    // Another user can neither list it nor open the write-ahead log in it.
    std::string wal;
    for (const std::string& n : ListDir(db)) {
      if (n.size() > 4 && n.substr(n.size() - 4) == ".log") wal = db + "/" + n;
    }
    ASSERT_FALSE(wal.empty()) << testing::PrintToString(ListDir(db));
    pid_t p = ForkChild([&] {
      if (setgid(kNobody) != 0 || setuid(kNobody) != 0) return 9;
      if (DIR* dd = opendir(db.c_str())) {
        closedir(dd);
        return 2;
      }
      int fd = open(wal.c_str(), O_RDONLY);
      return fd >= 0 ? 3 : 0;
    });
    EXPECT_EQ(WaitChild(p), 0) << "another user read the spill database";
  }
  EXPECT_TRUE(d.Stop().ok());
  EXPECT_FALSE(PathExists(db));
}

// Someone else's directory at the database's name (as root: another
// user's; otherwise one of ours that others may write, as hers would be):
// the start is refused naming it, and no row lands in it.
TEST(SpillDb, ADirectorySomeoneElsePutAtItsNameIsRefused) {
  SharedSpillDir dir;
  TestDaemon d;
  const std::string db = DbPath(dir.path(), d);
  ASSERT_EQ(mkdir(db.c_str(), 0777), 0);
  ASSERT_EQ(chmod(db.c_str(), 0777), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(db.c_str(), kNobody, kNobody), 0);
  }
  Status s = d.Start(Spilling(dir.path()));
  ASSERT_FALSE(s.ok()) << "the server started with " << db << " as its spill database";
  EXPECT_NE(s.message().find(db + " is a directory owned by"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("another -s DIR"), std::string::npos) << s.message();
  EXPECT_NE(d.ReadLog().find(db), std::string::npos);
  EXPECT_TRUE(ListDir(db).empty()) << testing::PrintToString(ListDir(db));
  rmdir(db.c_str());
}

// A link at the name, to a third user's private directory: never followed
// (a root server's RocksDB would create its files there, and --stop's
// DestroyDB would delete hers: a LOG of her own, say).
TEST(SpillDb, ALinkAtItsNameIsNeverFollowed) {
  SharedSpillDir dir;
  TempDir victim;
  const std::string victim_log = victim.path() + "/LOG";
  {
    int fd = open(victim_log.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "hers\n", 5), 5);
    close(fd);
  }
  if (geteuid() == 0) {
    ASSERT_EQ(chown(victim_log.c_str(), kThirdUser, kThirdUser), 0);
    ASSERT_EQ(chown(victim.path().c_str(), kThirdUser, kThirdUser), 0);
  }
  TestDaemon d;
  const std::string db = DbPath(dir.path(), d);
  ASSERT_EQ(symlink(victim.path().c_str(), db.c_str()), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(lchown(db.c_str(), kNobody, kNobody), 0);
  }
  Status s = d.Start(Spilling(dir.path()));
  if (s.ok()) {
    SpillSome(d);
    d.Stop().PermitUncheckedError();
  }
  EXPECT_FALSE(s.ok()) << "the server started through the link";
  EXPECT_NE(s.message().find(db + " is a symbolic link"), std::string::npos)
      << s.message();
  EXPECT_EQ(ListDir(victim.path()), std::vector<std::string>{"LOG"});
  struct stat st {};
  EXPECT_EQ(lstat(victim_log.c_str(), &st), 0) << "her file was removed";
  unlink(db.c_str());
}

// A spill dir others may write without the sticky bit: anyone could rename
// the database away and put a link in its place while the server runs.
TEST(SpillDb, ASpillDirOthersCouldSwapItInIsRefused) {
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0777), 0);
  TestDaemon d;
  Status s = d.Start(Spilling(dir.path()));
  ASSERT_FALSE(s.ok()) << "the server started in " << dir.path();
  EXPECT_NE(s.message().find(dir.path() + " may be written by others (mode 0777, not "
                                          "sticky)"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(ListDir(dir.path()).empty());
}

// One of ours that others may only read (made by an earlier version, or by
// hand): made 0700, used, and the log says so.
TEST(SpillDb, OneOfOursOthersMayReadIsMadeOwnerOnly) {
  SharedSpillDir dir;
  TestDaemon d;
  const std::string db = DbPath(dir.path(), d);
  ASSERT_EQ(mkdir(db.c_str(), 0700), 0);
  ASSERT_EQ(chmod(db.c_str(), 0755), 0);
  ASSERT_TRUE(d.Start(Spilling(dir.path())).ok());
  struct stat st {};
  ASSERT_EQ(lstat(db.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_NE(d.ReadLog().find(db + " was mode 0755: made 0700"), std::string::npos);
  EXPECT_GT(SpillSome(d), 0u);
  EXPECT_TRUE(d.Stop().ok());
}

}  // namespace
}  // namespace shmcache::test
