// Another user on the host can neither connect to the daemon nor open or
// map its shared memory, and is told "permission denied". Needs root (to
// create that user); skipped otherwise.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "format/shm_file.h"
#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

class TempUser {
 public:
  TempUser() : name_(fmt::format("shmrel{}", getpid())) {
    std::string out;
    rc_ = RunProgram({"/usr/sbin/useradd", "-M", "-r", "-s", "/usr/sbin/nologin", name_},
                     {}, &out);
    if (rc_ != 0) error_ = out;
    if (const passwd* pw = getpwnam(name_.c_str())) {
      uid_ = pw->pw_uid;
      gid_ = pw->pw_gid;
    } else if (error_.empty()) {
      error_ = "useradd gave no user";
    }
  }
  ~TempUser() {
    if (rc_ == 0) {
      std::string out;
      RunProgram({"/usr/sbin/userdel", name_}, {}, &out);
    }
  }
  const std::string& error() const { return error_; }
  uid_t uid() const { return uid_; }
  gid_t gid() const { return gid_; }
  // Drops to this user in the current (child) process.
  bool Become() const {
    return setgroups(0, nullptr) == 0 && setgid(gid_) == 0 && setuid(uid_) == 0;
  }

 private:
  std::string name_;
  int rc_ = -1;
  std::string error_;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
};

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return s;
}

TEST(OtherUsers, CannotConnectNorMapAndAreToldPermissionDenied) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create a second user";
  TempUser user;
  if (!user.error().empty()) GTEST_SKIP() << "cannot create a user: " << user.error();

  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  SessionCache sc;
  ASSERT_TRUE(OpenSessionCache(d, "secret", &sc).ok());
  std::unique_ptr<Client>& c = sc.client;
  std::unique_ptr<Cache>& cache = sc.cache;
  RowMaker m(1024);
  for (uint64_t id = 0; id < 10; ++id) ASSERT_TRUE(m.Put(*cache, id).ok());

  // Owner-only modes on everything.
  struct stat st;
  const std::string sock = fmt::format("{}/shmcached-{}.sock", d.run_dir(), d.port());
  ASSERT_EQ(stat(d.run_dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << d.run_dir();
  ASSERT_EQ(stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << sock;
  std::vector<std::string> files = d.ShmFiles();
  ASSERT_FALSE(files.empty());
  for (const std::string& f : files) {
    ASSERT_EQ(stat(f.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0077, 0u) << f << " is open to others";
  }
  // The shm dir itself may be world-writable (/dev/shm is): make ours so.
  chmod(d.shm_dir().c_str(), 01777);

  struct Result {
    char connect[1024];
    char open[1024];
    int raw_open_errno;
    int truncate_errno;
    int unlink_errno;
    int connect_code;
    int open_code;
    int peercred_refused;
  };
  Result* r = SharedBlock<Result>();
  ClientOptions co = d.client_options();
  auto as_user = [&](const std::function<int()>& body) {
    pid_t p = ForkChild([&] {
      if (!user.Become()) return 9;
      return body();
    });
    int ws = 0;
    EXPECT_TRUE(WaitChild(p, &ws, std::chrono::seconds(30)));
    return ws;
  };
  int ws = as_user([&] {
    std::unique_ptr<Client> oc;
    Status s = Client::Connect(co, &oc);
    r->connect_code = static_cast<int>(s.code());
    std::snprintf(r->connect, sizeof r->connect, "%s", s.ToString().c_str());
    ShmFile f;
    s = ShmFile::Open(files[0], &f);
    r->open_code = static_cast<int>(s.code());
    std::snprintf(r->open, sizeof r->open, "%s", s.ToString().c_str());
    // A truncated file would be a SIGBUS in every process that maps it.
    r->truncate_errno = truncate(files[0].c_str(), 0) != 0 ? errno : 0;
    r->unlink_errno = unlink(files[0].c_str()) != 0 ? errno : 0;
    int fd = open(files[0].c_str(), O_RDONLY);
    r->raw_open_errno = fd < 0 ? errno : 0;
    if (fd >= 0) {
      void* p = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) return 7;  // mapped: the worst outcome
    }
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(ws)) << DescribeStatus(ws);
  ASSERT_EQ(WEXITSTATUS(ws), 0) << "the other user could map a segment";
  fmt::print("other user: connect -> {}\nother user: open segment -> {}\n", r->connect,
             r->open);
  EXPECT_EQ(r->connect_code, static_cast<int>(Status::Code::kPermissionDenied));
  EXPECT_NE(Lower(r->connect).find("permission denied"), std::string::npos);
  EXPECT_EQ(r->open_code, static_cast<int>(Status::Code::kPermissionDenied));
  EXPECT_NE(Lower(r->open).find("permission denied"), std::string::npos);
  EXPECT_EQ(r->raw_open_errno, EACCES);
  EXPECT_EQ(r->truncate_errno, EACCES);
  EXPECT_EQ(r->unlink_errno, EPERM);

  // Even with the socket opened up by mistake, the daemon checks the peer's
  // credentials (SO_PEERCRED) and refuses the connection.
  const std::string parent = d.run_dir().substr(0, d.run_dir().rfind('/'));
  chmod(parent.c_str(), 0711);
  chmod(d.run_dir().c_str(), 0755);
  chmod(sock.c_str(), 0666);
  ws = as_user([&] {
    std::unique_ptr<Client> oc;
    Status s = Client::Connect(co, &oc);
    std::snprintf(r->connect, sizeof r->connect, "%s", s.ToString().c_str());
    return s.ok() ? 5 : 0;
  });
  chmod(sock.c_str(), 0600);
  chmod(d.run_dir().c_str(), 0700);
  chmod(parent.c_str(), 0700);
  ASSERT_TRUE(WIFEXITED(ws)) << DescribeStatus(ws);
  EXPECT_EQ(WEXITSTATUS(ws), 0) << "the daemon served another user";
  fmt::print("other user, socket opened up: connect -> {}\n", r->connect);
  EXPECT_NE(Lower(r->connect).find("permission denied"), std::string::npos) << r->connect;
  EXPECT_TRUE(WaitFor(
      [&] {
        return d.ReadLog().find("refused a connection from uid " +
                                std::to_string(user.uid())) != std::string::npos;
      },
      std::chrono::seconds(5)))
      << "no refusal in the daemon log";

  // The owner is unaffected.
  Row row;
  for (uint64_t id = 0; id < 10; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok());
    ASSERT_EQ(m.Verify(id, row.view()), "");
  }
  cache.reset();
  c.reset();
  EXPECT_TRUE(d.Stop().ok());
}

}  // namespace
}  // namespace shmcache::test
