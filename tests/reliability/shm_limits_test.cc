// A small shm filesystem (a size-limited tmpfs, mounted when root): too
// little room is refused at start, and running out at allocation time is a
// Full status naming the numbers and the fix; never a SIGBUS, and rows
// already cached stay readable.
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

class SmallTmpfs {
 public:
  explicit SmallTmpfs(int mb) {
    std::string opt = fmt::format("size={}m,mode=0700", mb);
    if (mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opt.c_str()) !=
        0) {
      error_ = std::strerror(errno);
    }
  }
  ~SmallTmpfs() {
    if (error_.empty()) umount2(dir_.path().c_str(), MNT_DETACH);
  }
  const std::string& error() const { return error_; }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::string error_;
};

#define REQUIRE_ROOT_MOUNT(fs)                                             \
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs"; \
  if (!(fs).error().empty()) {                                             \
    GTEST_SKIP() << "cannot mount a tmpfs here: " << (fs).error();         \
  }

TEST(ShmLimits, TooLittleRoomIsRefusedAtStartWithTheNumbersAndTheFix) {
  SmallTmpfs fs(8);
  REQUIRE_ROOT_MOUNT(fs);
  TestDaemon d;
  std::string out;
  int rc = RunProgram({AdminPath(), "--start", "-p", std::to_string(d.port()),
                       "--shm_dir", fs.path(), "--log_dir", d.log_dir()},
                      d.AdminEnv(), &out);
  fmt::print("start on an 8 MB tmpfs: exit {}: {}", rc, out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("no room in " + fs.path()), std::string::npos) << out;
  EXPECT_NE(out.find("8 MB free"), std::string::npos) << out;
  EXPECT_NE(out.find("16 MB needed"), std::string::npos) << out;
  EXPECT_NE(out.find("--shm-size"), std::string::npos) << out;
  EXPECT_NE(out.find("--shm_dir"), std::string::npos) << out;
}

TEST(ShmLimits, FullFilesystemMeansFullNeverSigbusAndEarlierRowsStay) {
  SmallTmpfs fs(48);
  REQUIRE_ROOT_MOUNT(fs);
  TestDaemon d;
  ASSERT_TRUE(d.Start({.shm_dir = fs.path()}).ok());
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Connect(d.client_options(), &c).ok());
  uint32_t sid;
  ASSERT_TRUE(c->CreateSession(&sid).ok());
  const RowMaker m(64 << 10);

  // The writer runs in a child: a SIGBUS would end it, not the test.
  struct Result {
    uint64_t written = 0;
    int full = 0;
    char first_full[1024] = {};
    char error[1024] = {};
  };
  Result* res = SharedBlock<Result>();
  pid_t w = ForkChild([&] {
    std::unique_ptr<Client> wc;
    std::unique_ptr<Cache> cache;
    Status s = Client::Connect(d.client_options(), &wc);
    if (s.ok()) {
      s = wc->OpenCache({.session_id = sid, .fingerprint = "big", .size_mb = 1024},
                        &cache);
    }
    if (!s.ok()) {
      std::snprintf(res->error, sizeof res->error, "%s", s.ToString().c_str());
      return 2;
    }
    for (uint64_t id = 0; id < 100000; ++id) {
      s = m.Put(*cache, id);
      if (s.IsFull()) {
        if (res->full++ == 0) {
          std::snprintf(res->first_full, sizeof res->first_full, "%s",
                        s.message().c_str());
        }
        if (res->full >= 50) return 0;  // it stays full
        continue;
      }
      if (!s.ok()) {
        std::snprintf(res->error, sizeof res->error, "%s", s.ToString().c_str());
        return 3;
      }
      res->written = id + 1;
    }
    return 4;  // never filled up
  });
  int st = 0;
  ASSERT_TRUE(WaitChild(w, &st, std::chrono::seconds(120)));
  ASSERT_TRUE(WIFEXITED(st)) << "writer died: " << DescribeStatus(st);
  ASSERT_EQ(WEXITSTATUS(st), 0) << res->error;
  const std::string msg = res->first_full;
  fmt::print("48 MB tmpfs: {} rows written, then Full: {}\n", res->written, msg);
  EXPECT_GT(res->written, 100u);
  EXPECT_NE(msg.find("no room in " + fs.path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("MB free"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--shm-size"), std::string::npos) << msg;

  // Every row written before is still there, byte for byte, in a new
  // process as in this one.
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(c->OpenCache({.session_id = sid, .fingerprint = "big"}, &cache).ok());
  CacheStats stats;
  ASSERT_TRUE(cache->GetStats(&stats).ok());
  EXPECT_EQ(stats.mem_rows, res->written);
  Row row;
  for (uint64_t id = 0; id < res->written; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
    ASSERT_EQ(m.Verify(id, row.view()), "") << id;
  }
  // The writer's exit gave back its chunk's tail, smaller than the row it
  // was refused; room given back to a full cache takes rows again (16 KB or
  // more of it: docs/capacity.md), so a few rows may still fit before Full.
  Status more;
  uint64_t id = res->written + 1;
  for (; id < res->written + 64 && (more = m.Put(*cache, id)).ok(); ++id) {
  }
  EXPECT_TRUE(more.IsFull()) << more.ToString() << " after " << id - res->written - 1
                             << " more rows";
  ASSERT_TRUE(cache->GetStats(&stats).ok());
  EXPECT_TRUE(stats.full);
  // The daemon is fine and other caches get a clear answer too.
  EXPECT_TRUE(d.Alive());
  std::unique_ptr<Cache> other;
  Status s =
      c->OpenCache({.session_id = sid, .fingerprint = "other", .size_mb = 64}, &other);
  if (s.ok()) {
    s = m.Put(*other, 1);
    EXPECT_TRUE(s.ok() || s.IsFull()) << s.ToString();
  } else {
    EXPECT_TRUE(s.IsFull()) << s.ToString();
  }
  cache.reset();
  other.reset();
  c.reset();
  EXPECT_TRUE(d.Stop().ok());
  EXPECT_TRUE(d.ShmFiles().empty());
}

}  // namespace
}  // namespace shmcache::test
