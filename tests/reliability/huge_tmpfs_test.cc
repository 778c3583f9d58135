// The shm dir a server picks when it is given none (daemon/huge_tmpfs.h):
// as root, its own huge-page tmpfs, adopted after a kill and gone after a
// clean stop; otherwise /dev/shm with one log line saying why, and never a
// symlink or someone else's directory planted at the mount path. The
// mounting cases need root and shmem transparent huge pages; they skip
// with the reason otherwise.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "format/instance.h"
#include "shmcache/stats.h"
#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

constexpr uint64_t kRows = 300;
constexpr uid_t kNobody = 65534;

std::string ReadAll(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The line of /proc/self/mountinfo whose mount point is `dir`, or "".
std::string MountInfoLine(const std::string& dir) {
  std::istringstream in(ReadAll("/proc/self/mountinfo"));
  std::string found;
  for (std::string line; std::getline(in, line);) {
    if (line.find(fmt::format(" {} ", dir)) != std::string::npos) found = line;
  }
  return found;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1))
    ++n;
  return n;
}

// Why this host cannot test mounting, or "".
std::string CannotMount() {
  if (geteuid() != 0) return "needs root to mount a tmpfs";
  std::string thp = ReadAll("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  if (thp.empty()) return "the kernel has no shmem transparent huge pages";
  if (thp.find("[deny]") != std::string::npos) return "shmem huge pages are denied";
  if (thp.find("[force]") != std::string::npos) return "/dev/shm pages are huge already";
  return "";
}

// A server without --shm_dir that asks for its own huge-page tmpfs.
TestDaemon::Options HugeAsked() {
  TestDaemon::Options o;
  o.default_shm_dir = true;
  o.memory_cap_mb = 256;
  o.extra_env = {"SHMCACHE_HUGE_TMPFS=1"};
  return o;
}

void PutRows(const TestDaemon& d, SessionCache* sc, uint64_t rows = kRows) {
  ASSERT_TRUE(OpenSessionCache(d, "huge", sc).ok());
  RowMaker m(3072);
  for (uint64_t id = 0; id < rows; ++id) ASSERT_TRUE(m.Put(*sc->cache, id).ok());
}

// Reads every row back in another process; 0 when all are right.
int ReadRowsElsewhere(const TestDaemon& d, uint32_t session, uint64_t rows = kRows) {
  pid_t p = ForkChild([&] {
    std::unique_ptr<Client> c;
    std::unique_ptr<Cache> cache;
    RowMaker m(3072);
    Status s = Client::Connect(d.client_options(), &c);
    if (s.ok()) s = c->OpenCache({.session_id = session, .fingerprint = "huge"}, &cache);
    if (!s.ok()) return 2;
    Row row;
    for (uint64_t id = 0; id < rows; ++id) {
      if (!cache->Get(id, &row).ok() || !m.Verify(id, row.view()).empty()) return 3;
    }
    return 0;
  });
  int st = 0;
  if (!WaitChild(p, &st, std::chrono::seconds(60))) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Starts `d` asking for huge pages, puts kRows rows in a session
// (*session) and kills it: the rows stay in its mount.
void KillWithRows(TestDaemon* d, uint32_t* session) {
  ASSERT_TRUE(d->Start(HugeAsked()).ok());
  SessionCache sc;
  PutRows(*d, &sc);
  *session = sc.session;
  sc = SessionCache{};
  d->Kill();
}

TEST(HugeTmpfs, AskedForAsRootItMountsHugePagesAndStopRemovesThem) {
  if (std::string why = CannotMount(); !why.empty()) GTEST_SKIP() << why;
  TestDaemon d;
  ASSERT_TRUE(d.Start(HugeAsked()).ok());
  const std::string dir = HugeShmDir(d.port());
  EXPECT_EQ(d.shm_dir(), dir);
  std::string mount = MountInfoLine(dir);
  EXPECT_NE(mount.find(" - tmpfs "), std::string::npos) << mount;
  EXPECT_NE(mount.find("huge=within_size"), std::string::npos) << mount;
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  SessionCache sc;
  PutRows(d, &sc);
  std::vector<std::string> files = d.ShmFiles();
  EXPECT_GT(files.size(), 2u);
  for (const std::string& f : files) EXPECT_EQ(f.rfind(dir + "/", 0), 0u) << f;
  EXPECT_EQ(ReadRowsElsewhere(d, sc.session), 0);
  ServerInfo info;
  ASSERT_TRUE(sc.client->GetServerInfo(&info).ok());
  EXPECT_TRUE(info.shm_huge_pages) << info.shm_pages;
  EXPECT_EQ(info.shm_dir, dir);
  EXPECT_NE(d.ReadLog().find("mounted huge=within_size by this server"),
            std::string::npos);

  sc = SessionCache{};
  ASSERT_TRUE(d.Stop().ok());
  EXPECT_EQ(MountInfoLine(dir), "");
  EXPECT_FALSE(Exists(dir));
}

TEST(HugeTmpfs, RestartAfterKillAdoptsTheRowsInTheMount) {
  if (std::string why = CannotMount(); !why.empty()) GTEST_SKIP() << why;
  TestDaemon d;
  uint32_t session = 0;
  ASSERT_NO_FATAL_FAILURE(KillWithRows(&d, &session));
  // A killed server leaves its mount, with the rows, to the next one.
  EXPECT_TRUE(d.HugeMounted());
  ASSERT_TRUE(d.Restart().ok());
  EXPECT_NE(d.ReadLog().find("adopted from an earlier server"), std::string::npos);
  EXPECT_EQ(ReadRowsElsewhere(d, session), 0);
  ASSERT_TRUE(d.Stop().ok());
  EXPECT_FALSE(d.HugeMounted());
  EXPECT_FALSE(Exists(HugeShmDir(d.port())));
}

// A start refused after it mounted its tmpfs (a spill dir where it cannot
// make its database: /proc) takes the empty mount down with its lock files.
// It stayed mounted in /dev/shm for good: no lock file named it any more,
// so --stop said there was nothing to stop.
TEST(HugeTmpfs, AStartRefusedAfterItMountedLeavesNoMount) {
  if (std::string why = CannotMount(); !why.empty()) GTEST_SKIP() << why;
  TestDaemon d;
  TestDaemon::Options o = HugeAsked();
  o.extra_args = {"--spilldir=/proc"};
  Status s = d.Start(o);
  const std::string dir = HugeShmDir(d.port());
  const bool mounted = !MountInfoLine(dir).empty();
  const bool left = Exists(dir);
  if (mounted) umount2(dir.c_str(), UMOUNT_NOFOLLOW | MNT_DETACH);  // failing: not
  if (left) rmdir(dir.c_str());                                     // left either
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("cannot create /proc/"), std::string::npos) << s.ToString();
  EXPECT_FALSE(mounted);
  EXPECT_FALSE(left);
  EXPECT_FALSE(Exists(HostLockPath(d.port())));
}

// With a killed server's rows in the mount, a refused start leaves the
// mount and its lock files: the next start serves every row.
TEST(HugeTmpfs, AStartRefusedOverAKilledServersRowsKeepsThem) {
  if (std::string why = CannotMount(); !why.empty()) GTEST_SKIP() << why;
  TestDaemon d;
  uint32_t session = 0;
  ASSERT_NO_FATAL_FAILURE(KillWithRows(&d, &session));
  TestDaemon::Options refused = HugeAsked();
  refused.extra_args = {"--spilldir=/proc"};
  ASSERT_FALSE(d.Start(refused).ok());
  EXPECT_TRUE(d.HugeMounted());
  EXPECT_TRUE(Exists(HostLockPath(d.port())));
  ASSERT_TRUE(d.Start(HugeAsked()).ok());
  EXPECT_EQ(ReadRowsElsewhere(d, session), 0) << d.ReadLog();
  ASSERT_TRUE(d.Stop().ok());
}

// Not asked for (the default): /dev/shm, and one line saying how to get
// huge pages.
TEST(HugeTmpfs, NotAskedForItUsesDevShmWithOneLogLine) {
  if (geteuid() == 0 && !CannotMount().empty()) GTEST_SKIP() << CannotMount();
  TestDaemon d;
  TestDaemon::Options o = HugeAsked();
  o.extra_env = {};
  ASSERT_TRUE(d.Start(o).ok());
  EXPECT_EQ(d.shm_dir(), "/dev/shm");
  EXPECT_FALSE(Exists(HugeShmDir(d.port())));
  EXPECT_EQ(MountInfoLine(HugeShmDir(d.port())), "");
  std::string log = d.ReadLog();
  EXPECT_EQ(Count(log, "shm dir /dev/shm: 4 KB pages"), 1u) << log;
  EXPECT_NE(log.find("huge=within_size"), std::string::npos) << log;
  SessionCache sc;
  PutRows(d, &sc);
  EXPECT_EQ(ReadRowsElsewhere(d, sc.session), 0);
  sc = SessionCache{};
  ASSERT_TRUE(d.Stop().ok());
}

TEST(HugeTmpfs, ServerWithoutCapSysAdminFallsBackWithTheReason) {
  if (std::string why = CannotMount(); !why.empty()) GTEST_SKIP() << why;
  if (!RunnableBy(kNobody, DaemonPath())) {
    GTEST_SKIP() << DaemonPath() << " is out of reach of uid " << kNobody
                 << " (a parent directory is closed to other users)";
  }
  TestDaemon d;
  TestDaemon::Options o = HugeAsked();
  o.uid = kNobody;  // a real non-root server: mount(2) is not allowed
  ASSERT_TRUE(d.Start(o).ok());
  EXPECT_FALSE(Exists(fmt::format("/dev/shm/shmcache.{}.{}.huge", kNobody, d.port())));
  std::string log = d.ReadLog();
  EXPECT_EQ(Count(log, "no huge-page tmpfs of its own"), 1u) << log;
  EXPECT_NE(log.find("shm dir /dev/shm: 4 KB pages"), std::string::npos) << log;
  EXPECT_NE(log.find("needs root (CAP_SYS_ADMIN)"), std::string::npos) << log;
  // It serves nobody but its own user: stop it by signal.
  kill(d.pid(), SIGTERM);
  EXPECT_TRUE(WaitFor([&] { return !d.Alive(); }, std::chrono::seconds(20)));
}

// Someone else's symlink (to a directory it owns) or directory at the mount
// path: not followed, not mounted over; the server says so and uses
// /dev/shm.
TEST(HugeTmpfs, PlantedSymlinkOrForeignDirectoryIsNeverUsed) {
  if (std::string why = CannotMount(); !why.empty()) GTEST_SKIP() << why;
  for (bool symlink_plant : {true, false}) {
    SCOPED_TRACE(symlink_plant ? "symlink" : "directory");
    TempDir target("/dev/shm");
    ASSERT_EQ(chown(target.path().c_str(), kNobody, kNobody), 0);
    TestDaemon d;
    const std::string dir = HugeShmDir(d.port());
    if (symlink_plant) {
      ASSERT_EQ(symlink(target.path().c_str(), dir.c_str()), 0);
      ASSERT_EQ(lchown(dir.c_str(), kNobody, kNobody), 0);
    } else {
      ASSERT_EQ(mkdir(dir.c_str(), 0777), 0);
      ASSERT_EQ(chown(dir.c_str(), kNobody, kNobody), 0);
    }
    ASSERT_TRUE(d.Start(HugeAsked()).ok());
    EXPECT_EQ(d.shm_dir(), "/dev/shm");
    EXPECT_EQ(MountInfoLine(dir), "");
    EXPECT_EQ(MountInfoLine(target.path()), "");
    std::string log = d.ReadLog();
    EXPECT_EQ(Count(log, "no huge-page tmpfs of its own"), 1u) << log;
    EXPECT_NE(log.find(symlink_plant ? "not following it" : "belongs to uid 65534"),
              std::string::npos)
        << log;
    SessionCache sc;
    PutRows(d, &sc);
    sc = SessionCache{};
    ASSERT_TRUE(d.Stop().ok());
    struct stat st;
    ASSERT_EQ(lstat(dir.c_str(), &st), 0);  // left as it was
    EXPECT_EQ(st.st_uid, kNobody);
    EXPECT_EQ(symlink_plant, S_ISLNK(st.st_mode));
    unlink(dir.c_str());
    rmdir(dir.c_str());
  }
}

// ---- A restart in the other mode (issue 32, item 6) -------------------------

// The move of a killed huge-mode server's rows to /dev/shm once copied every
// file through one fixed name there, <prefix>moving: another user's
// directory at that name made a root restart remove every cache from both
// places. Copies have no name now.
TEST(HugeTmpfs, APlantedDirectoryAtTheOldMovingNameCostsNoRow) {
  if (std::string why = CannotMount(); !why.empty()) GTEST_SKIP() << why;
  TestDaemon d;
  uint32_t session = 0;
  ASSERT_NO_FATAL_FAILURE(KillWithRows(&d, &session));
  const std::string planted =
      fmt::format("/dev/shm/{}moving", InstancePrefix(geteuid(), d.port()));
  ASSERT_EQ(mkdir(planted.c_str(), 0777), 0);
  ASSERT_EQ(chown(planted.c_str(), kNobody, kNobody), 0);
  TestDaemon::Options plain = HugeAsked();
  plain.extra_env = {};
  Status s = d.Start(plain);
  rmdir(planted.c_str());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(d.shm_dir(), "/dev/shm");
  EXPECT_EQ(ReadRowsElsewhere(d, session), 0) << d.ReadLog();
  EXPECT_FALSE(d.HugeMounted());
  ASSERT_TRUE(d.Stop().ok());
}

// A cache that does not fit in the new place (a huge tmpfs sized to a lower
// cap) loses nothing: it stays whole in /dev/shm, where a start in the
// earlier mode serves every row. (It used to be removed from both places.)
TEST(HugeTmpfs, ACacheThatDoesNotFitTheNewPlaceStaysWhereItWas) {
  if (std::string why = CannotMount(); !why.empty()) GTEST_SKIP() << why;
  constexpr uint64_t kMany = 60000;  // ~100 MB of segments, past 8 + 64 MB
  TestDaemon d;
  TestDaemon::Options plain = HugeAsked();
  plain.extra_env = {};
  ASSERT_TRUE(d.Start(plain).ok());
  ASSERT_EQ(d.shm_dir(), "/dev/shm");
  SessionCache sc;
  PutRows(d, &sc, kMany);
  const uint32_t session = sc.session;
  sc = SessionCache{};
  d.Kill();
  TestDaemon::Options small = HugeAsked();
  small.memory_cap_mb = 8;  // a tmpfs of 72 MB
  ASSERT_TRUE(d.Start(small).ok());
  std::string log = d.ReadLog();
  EXPECT_NE(log.find("not moved to " + HugeShmDir(d.port()) + ", left in /dev/shm"),
            std::string::npos)
      << log;
  ASSERT_TRUE(d.Stop().ok());
  ASSERT_TRUE(d.Start(plain).ok());
  EXPECT_EQ(ReadRowsElsewhere(d, session, kMany), 0) << d.ReadLog();
  ASSERT_TRUE(d.Stop().ok());
}

}  // namespace
}  // namespace shmcache::test
