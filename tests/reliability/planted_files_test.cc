// Files someone else put in the shm dir (world-writable, like /dev/shm):
// a planted copy of a segment or header file under one of a cache's names
// is never adopted by a restarted server, never mapped by a client, and
// never written; names taken ahead of the server do not stop caches from
// opening and filling; a stray segment number does not stall a start; the
// sessions list's one fixed name cannot be blocked unseen.
// Giving a file to another uid needs root; that case is skipped otherwise.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "format/instance.h"
#include "shmcache/stats.h"
#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

constexpr uint64_t kRows = 100;

// Ways a file under one of our names can fail to be ours.
enum class Plant { kMode0666, kOtherOwner, kSymlink, kHardLink };
enum class Target { kSegment, kHeader };

std::string Describe(Plant p) {
  switch (p) {
    case Plant::kMode0666: return "Mode0666";
    case Plant::kOtherOwner: return "OtherOwner";
    case Plant::kSymlink: return "Symlink";
    case Plant::kHardLink: return "HardLink";
  }
  return "?";
}

std::string ReadAll(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return "";
  std::string out(static_cast<size_t>(st.st_size), '\0');
  ssize_t n = pread(fd, out.data(), out.size(), 0);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

std::string ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out = ReadAll(fd);
  close(fd);
  return out;
}

bool Exists(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

// A file with `bytes`, created with exactly `mode`; returns an open fd.
int WriteNew(const std::string& path, const std::string& bytes, mode_t mode) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return -1;
  if (fchmod(fd, mode) != 0 ||
      pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// A copy of a file of ours, put under its name in a way that makes it not
// ours. Keeps the planted file open, so that its bytes can be checked
// after the server removed the name.
class Planted {
 public:
  Planted(const std::string& path, Plant how, const std::string& aside_dir)
      : path_(path), bytes_(ReadFile(path)) {
    if (bytes_.empty() || unlink(path.c_str()) != 0) return;
    std::string aside = aside_dir + "/planted";
    switch (how) {
      case Plant::kMode0666: fd_ = WriteNew(path, bytes_, 0666); break;
      case Plant::kOtherOwner:
        fd_ = WriteNew(path, bytes_, 0600);
        if (fd_ >= 0 && fchown(fd_, 65534, 65534) != 0) Close();
        break;
      case Plant::kSymlink:
        fd_ = WriteNew(aside, bytes_, 0600);
        if (fd_ >= 0 && symlink(aside.c_str(), path.c_str()) != 0) Close();
        break;
      case Plant::kHardLink:
        fd_ = WriteNew(aside, bytes_, 0600);
        if (fd_ >= 0 && link(aside.c_str(), path.c_str()) != 0) Close();
        break;
    }
  }
  ~Planted() { Close(); }
  bool ok() const { return fd_ >= 0; }
  // Whether the planted file still holds exactly the bytes it was given.
  bool Unchanged() const { return ReadAll(fd_) == bytes_; }
  const std::string& path() const { return path_; }

 private:
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  std::string path_;
  std::string bytes_;
  int fd_ = -1;
};

std::string CachePath(const TestDaemon& d, uint32_t id) {
  return fmt::format("{}/{}cache.{}", d.shm_dir(), d.shm_prefix(), id);
}
std::string SegmentPath(const TestDaemon& d, uint32_t id, uint32_t n) {
  return fmt::format("{}/{}seg.{}.{}", d.shm_dir(), d.shm_prefix(), id, n);
}

// Whether segment n of cache id exists with its header published.
bool SegmentReady(const TestDaemon& d, uint32_t id, uint32_t n) {
  std::string bytes = ReadFile(SegmentPath(d, id, n));
  uint64_t magic = 0;
  if (bytes.size() >= sizeof magic) std::memcpy(&magic, bytes.data(), sizeof magic);
  return magic != 0;
}

void PutRows(const RowMaker& m, Cache& cache, uint64_t first, uint64_t n) {
  for (uint64_t id = first; id < first + n; ++id) {
    Status s = m.Put(cache, id);
    ASSERT_TRUE(s.ok()) << id << ": " << s.ToString();
  }
}

void ExpectRows(const RowMaker& m, Cache& cache, uint64_t first, uint64_t n) {
  Row row;
  for (uint64_t id = first; id < first + n; ++id) {
    Status s = cache.Get(id, &row);
    ASSERT_TRUE(s.ok()) << id << ": " << s.ToString();
    ASSERT_EQ(m.Verify(id, row.view()), "") << id;
  }
}

class PlantedFile : public ::testing::TestWithParam<std::tuple<Plant, Target>> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == Plant::kOtherOwner && geteuid() != 0) {
      GTEST_SKIP() << "needs root to give a file to another uid";
    }
    ASSERT_TRUE(d_.Start().ok());
    ASSERT_TRUE(OpenSessionCache(d_, "planted", &sc_).ok());
    cache_id_ = sc_.cache->cache_id();
    PutRows(m_, *sc_.cache, 0, kRows);
    // The first chunk takes the whole first segment, so the server
    // prepares the next one: the segment later rows would go to.
    ASSERT_TRUE(WaitFor([&] { return SegmentReady(d_, cache_id_, 1); },
                        std::chrono::seconds(20)));
  }
  // The file the test replaces: the header, or segment `seg_no`.
  std::string TargetPath(uint32_t seg_no) const {
    return std::get<1>(GetParam()) == Target::kHeader
               ? CachePath(d_, cache_id_)
               : SegmentPath(d_, cache_id_, seg_no);
  }

  TestDaemon d_;
  TempDir aside_{"/dev/shm"};  // same filesystem: hard links work
  RowMaker m_{1024};
  SessionCache sc_;
  uint32_t cache_id_ = 0;
};

TEST_P(PlantedFile, RestartedServerNeitherAdoptsNorWritesIt) {
  sc_.cache.reset();
  d_.Kill();
  // Segment 1 is where a restarted server would put further rows.
  Planted planted(TargetPath(1), std::get<0>(GetParam()), aside_.path());
  ASSERT_TRUE(planted.ok()) << strerror(errno);

  ASSERT_TRUE(d_.Restart().ok());
  // The cache is not adopted: the same session and name give a new cache,
  // which fills and serves, and none of it lands in the planted file.
  std::unique_ptr<Client> client;
  ASSERT_TRUE(Client::Connect(d_.client_options(), &client).ok());
  std::unique_ptr<Cache> cache;
  Status s =
      client->OpenCache({.session_id = sc_.session, .fingerprint = "planted"}, &cache);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(cache->cache_id(), cache_id_)
      << "the cache with the planted file was adopted";
  Row row;
  EXPECT_TRUE(cache->Get(0, &row).IsNotFound());
  PutRows(m_, *cache, kRows, 2 * kRows);
  ExpectRows(m_, *cache, kRows, 2 * kRows);
  EXPECT_TRUE(planted.Unchanged()) << "rows were written into the planted file";
  std::string log = d_.ReadLog();
  EXPECT_NE(log.find(planted.path()), std::string::npos) << log;
  EXPECT_NE(log.find("not ours"), std::string::npos) << log;
  // The name is removed (never followed: a link's target stays).
  EXPECT_FALSE(Exists(planted.path()));
  if (std::get<0>(GetParam()) == Plant::kSymlink) {
    EXPECT_TRUE(Exists(aside_.path() + "/planted"));
  }
  cache.reset();
  client.reset();
  sc_ = {};
  EXPECT_TRUE(d_.Stop().ok());
}

TEST_P(PlantedFile, ClientNeverMapsIt) {
  // The server keeps serving from the files it made (it has them mapped);
  // segment 0 holds row 0.
  Planted planted(TargetPath(0), std::get<0>(GetParam()), aside_.path());
  ASSERT_TRUE(planted.ok()) << strerror(errno);
  // A new process maps the files anew; it is refused with a clear error,
  // never served the planted bytes, and never crashes.
  struct Result {
    char text[1024];
  };
  Result* r = SharedBlock<Result>();
  const bool header = std::get<1>(GetParam()) == Target::kHeader;
  pid_t kid = ForkChild([&]() -> int {
    std::unique_ptr<Client> c;
    if (!Client::Connect(d_.client_options(), &c).ok()) return 2;
    std::unique_ptr<Cache> k;
    Status s = c->OpenCache({.session_id = sc_.session, .fingerprint = "planted"}, &k);
    if (s.ok() && !header) {
      Row row;
      s = k->Get(0, &row);
    }
    std::snprintf(r->text, sizeof r->text, "%s", s.ToString().c_str());
    return s.IsPermissionDenied() ? 0 : 3;
  });
  int ws = 0;
  ASSERT_TRUE(WaitChild(kid, &ws, std::chrono::seconds(30)));
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)
      << DescribeStatus(ws) << ": " << r->text;
  EXPECT_NE(std::string(r->text).find("not ours"), std::string::npos) << r->text;
  EXPECT_TRUE(planted.Unchanged());
  sc_ = {};
  EXPECT_TRUE(d_.Stop().ok());
}

INSTANTIATE_TEST_SUITE_P(
    All, PlantedFile,
    ::testing::Combine(::testing::Values(Plant::kMode0666, Plant::kOtherOwner,
                                         Plant::kSymlink, Plant::kHardLink),
                       ::testing::Values(Target::kSegment, Target::kHeader)),
    [](const auto& info) {
      return Describe(std::get<0>(info.param)) +
             (std::get<1>(info.param) == Target::kHeader ? "Header" : "Segment");
    });

// A file under one of our names made ahead of the server: another user's
// when running as root, else a plain 0644 file.
class TakenName {
 public:
  explicit TakenName(const std::string& path) : path_(path) {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    ok_ = fd >= 0 && (geteuid() != 0 || fchown(fd, 65534, 65534) == 0);
    if (fd >= 0) close(fd);
  }
  bool ok() const { return ok_; }
  // Still there, empty, with the owner it was given.
  bool Untouched() const {
    struct stat st;
    return lstat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0 &&
           st.st_uid == (geteuid() == 0 ? 65534u : geteuid());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool ok_ = false;
};

TEST(TakenNames, CachesStillOpenFillAndGrow) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  std::vector<std::unique_ptr<TakenName>> taken;
  auto take = [&](const std::string& name) {
    taken.push_back(
        std::make_unique<TakenName>(d.shm_dir() + "/" + d.shm_prefix() + name));
    return taken.back()->ok();
  };
  // The cache ids an earlier server handed out in order.
  for (int id = 1; id <= 64; ++id) ASSERT_TRUE(take(fmt::format("cache.{}", id)));
  std::unique_ptr<Client> client;
  ASSERT_TRUE(Client::Connect(d.client_options(), &client).ok());
  uint32_t session = 0;
  ASSERT_TRUE(client->CreateSession(&session).ok());
  RowMaker m(1024);
  for (int i = 0; i < 5; ++i) {
    std::unique_ptr<Cache> cache;
    Status s = client->OpenCache(
        {.session_id = session, .fingerprint = fmt::format("c{}", i)}, &cache);
    ASSERT_TRUE(s.ok()) << s.ToString();
    PutRows(m, *cache, 0, 10);
    ExpectRows(m, *cache, 0, 10);
  }

  // Someone who sees a cache's files takes the names of its next segments
  // and (in the old form) index tables.
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(
      client
          ->OpenCache({.session_id = session, .fingerprint = "big", .size_mb = 32},
                      &cache)
          .ok());
  const uint32_t id = cache->cache_id();
  for (uint32_t n = 0; n < 64; ++n) ASSERT_TRUE(take(fmt::format("seg.{}.{}", id, n)));
  for (uint32_t n = 65; n < 70; ++n) ASSERT_TRUE(take(fmt::format("seg.{}.{}", id, n)));
  for (uint32_t g = 1; g < 5; ++g) ASSERT_TRUE(take(fmt::format("table.{}.{}", id, g)));
  const uint64_t rows = 20000;  // ~12 MB: several segments, and the index doubles
  PutRows(m, *cache, 0, rows);
  ExpectRows(m, *cache, 0, rows);
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, rows);
  EXPECT_FALSE(st.full);
  size_t tables = 0, segments = 0;
  for (const std::string& f : d.ShmFiles()) {
    ShmName n = ParseShmName(f.substr(d.shm_dir().size() + 1 + d.shm_prefix().size()));
    tables += n.kind == ShmName::Kind::kTable && n.cache_id == id;
    segments += n.kind == ShmName::Kind::kSegment && n.cache_id == id && n.number >= 64;
  }
  EXPECT_GE(tables, 2u) << "the index did not grow";
  EXPECT_GE(segments, 3u);
  for (const auto& t : taken) EXPECT_TRUE(t->Untouched()) << t->path();
  std::string log = d.ReadLog();
  EXPECT_NE(log.find(fmt::format("seg.{}.0 exists", id)), std::string::npos) << log;
  cache.reset();
  client.reset();
  EXPECT_TRUE(d.Stop().ok());
}

TEST(StraySegmentNumber, StartIsNotStalledAndAdoptsTheRest) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  RowMaker m(1024);
  uint32_t id = 0, session = 0;
  {
    SessionCache sc;
    ASSERT_TRUE(OpenSessionCache(d, "stray", &sc).ok());
    PutRows(m, *sc.cache, 0, kRows);
    id = sc.cache->cache_id();
    session = sc.session;
  }
  d.Kill();
  // A number far past any a cache reaches (and past what a location holds).
  const std::string stray = SegmentPath(d, id, 4000000000u);
  int fd = WriteNew(stray, std::string(8192, 'x'), 0600);
  ASSERT_GE(fd, 0);
  close(fd);

  ASSERT_TRUE(d.Restart().ok());  // within TestDaemon's bound
  std::unique_ptr<Client> client;
  ASSERT_TRUE(Client::Connect(d.client_options(), &client).ok());
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(
      client->OpenCache({.session_id = session, .fingerprint = "stray"}, &cache).ok());
  EXPECT_EQ(cache->cache_id(), id) << "the cache was not adopted";
  ExpectRows(m, *cache, 0, kRows);
  EXPECT_FALSE(Exists(stray));
  EXPECT_NE(d.ReadLog().find(stray), std::string::npos);
  cache.reset();
  client.reset();
  EXPECT_TRUE(d.Stop().ok());
}

// ---- The sessions list: one fixed name in the shm dir (issue 32, item 7) --
//
// A rename cannot replace a directory, so a directory at the list's name
// used to make every rewrite of it fail unseen: `-g` said "Session
// created", and after a kill -9 the session was gone.

std::string SessionsList(const TestDaemon& d) {
  return d.shm_dir() + "/" + d.shm_prefix() + "sessions";
}

// The list's place taken while the server runs (where a sticky shm dir
// keeps others out, only by the user's own doing): the session is not
// created, the admin says why, the log too.
TEST(PlantedSessionsList, ASessionThatCannotBeRecordedIsNotCreated) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  const std::string list = SessionsList(d);
  ASSERT_EQ(unlink(list.c_str()), 0);
  ASSERT_EQ(mkdir(list.c_str(), 0755), 0);
  std::string out;
  int rc =
      RunProgram({AdminPath(), "-g", "-p", std::to_string(d.port())}, d.AdminEnv(), &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_EQ(out.find("Session created"), std::string::npos) << out;
  EXPECT_NE(out.find("no session was created"), std::string::npos) << out;
  EXPECT_NE(out.find(list), std::string::npos) << out;
  EXPECT_NE(d.ReadLog().find("the list of sessions is not written"), std::string::npos);
  std::unique_ptr<Client> client;
  ASSERT_TRUE(Client::Connect(d.client_options(), &client).ok());
  std::vector<SessionInfo> sessions;
  ASSERT_TRUE(client->ListSessions(&sessions).ok());
  EXPECT_TRUE(sessions.empty());
  // Destroying a session still destroys it, and says what a restart would do.
  ASSERT_EQ(rmdir(list.c_str()), 0);
  uint32_t session = 0;
  ASSERT_TRUE(client->CreateSession(&session).ok());
  ASSERT_EQ(unlink(list.c_str()), 0);
  ASSERT_EQ(mkdir(list.c_str(), 0755), 0);
  Status s = client->DestroySession(session);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_NE(s.message().find("would list it again"), std::string::npos) << s.message();
  EXPECT_TRUE(client->CheckSession(session).IsNotFound());
  ASSERT_EQ(rmdir(list.c_str()), 0);
  client.reset();
  EXPECT_TRUE(d.Stop().ok());
}

// Planted while no server runs (another user's directory, as root): the
// next start removes it with a log line (the start of a server that may
// not: below), and sessions created from then on survive a kill -9.
TEST(PlantedSessionsList, APlantedEntryIsSetAsideAtStartAndSessionsSurviveAKill) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  ASSERT_EQ(chmod(d.shm_dir().c_str(), 01777), 0);  // as /dev/shm
  d.Kill();
  // The spill record's name too: the other fixed name the server writes.
  const std::string list = SessionsList(d);
  const std::string record = d.shm_dir() + "/" + d.shm_prefix() + "spilldb";
  unlink(list.c_str());
  for (const std::string& p : {list, record}) {
    ASSERT_EQ(mkdir(p.c_str(), 0777), 0);
    if (geteuid() == 0) {
      ASSERT_EQ(chown(p.c_str(), 65534, 65534), 0);
    }
  }
  ASSERT_TRUE(d.Restart().ok());
  std::string log = d.ReadLog();
  for (const std::string& p : {list, record}) {
    EXPECT_NE(log.find("removed " + p + ", a directory owned by"), std::string::npos)
        << log;
  }
  EXPECT_FALSE(PathExists(record));
  uint32_t session = 0;
  {
    std::unique_ptr<Client> client;
    ASSERT_TRUE(Client::Connect(d.client_options(), &client).ok());
    ASSERT_TRUE(client->CreateSession(&session).ok());
  }
  d.Kill();
  ASSERT_TRUE(d.Restart().ok());
  std::unique_ptr<Client> client;
  ASSERT_TRUE(Client::Connect(d.client_options(), &client).ok());
  Status s = client->CheckSession(session);
  EXPECT_TRUE(s.ok()) << "the session did not survive a kill: " << s.ToString();
  client.reset();
  EXPECT_TRUE(d.Stop().ok());
}

// A server that may not remove what holds the name (a server of another
// user; the entry root's, in a sticky dir) does not start, and says why:
// every session it made would be lost at a restart.
TEST(PlantedSessionsList, AServerThatCannotSetItAsideDoesNotStart) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a server as another uid";
  constexpr uid_t kNobody = 65534;
  if (!RunnableBy(kNobody, DaemonPath())) {
    GTEST_SKIP() << DaemonPath() << " is out of reach of uid " << kNobody
                 << " (a parent directory is closed to other users)";
  }
  TempDir shm("/dev/shm");
  ASSERT_EQ(chmod(shm.path().c_str(), 01777), 0);
  TestDaemon d;
  const std::string list =
      shm.path() + "/" + InstancePrefix(kNobody, d.port()) + "sessions";
  ASSERT_EQ(mkdir(list.c_str(), 0755), 0);  // root's
  TestDaemon::Options o;
  o.uid = kNobody;
  o.shm_dir = shm.path();
  Status s = d.Start(o);
  EXPECT_FALSE(s.ok()) << "the server started without a list of sessions";
  EXPECT_NE(s.message().find("the list of sessions " + list + " cannot be written"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("another --shm_dir or port"), std::string::npos)
      << s.message();
  struct stat st {};
  EXPECT_EQ(lstat(list.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode) && st.st_uid == 0) << "root's directory was touched";
}

}  // namespace
}  // namespace shmcache::test
