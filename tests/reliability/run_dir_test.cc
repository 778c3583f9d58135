// The run dir (/tmp/shmcache-<uid>, or $SHMCACHE_RUN_DIR) holds the socket
// every client of the instance connects to. In /tmp anyone may put a link
// at its name: followed, it lets its owner later point the name at her own
// socket, and the trainer then talks to her process. So the server takes
// only a real directory of its user that no one else may write (one that
// others may only read is made 0700), and the client checks, on every
// connection, that the process listening there runs as its own user
// (SO_PEERCRED). Cases that give a file to another uid, or run a process
// as one, need root and skip otherwise. Issue 32, item 5.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

constexpr uid_t kNobody = 65534;

// Starts `d`, expecting a refusal whose message holds each of `words`.
void ExpectRefused(TestDaemon& d, const std::vector<std::string>& words) {
  Status s = d.Start();
  ASSERT_FALSE(s.ok()) << "the server started in " << d.run_dir();
  for (const std::string& w : words) {
    EXPECT_NE(s.message().find(w), std::string::npos) << w << " not in: " << s.message();
  }
  EXPECT_FALSE(PathExists(d.run_dir() + fmt::format("/shmcached-{}.sock", d.port())));
}

// A link at the run dir's name is never followed, not even to a directory
// of the user's own (its owner could repoint it at any time).
TEST(RunDir, ALinkAtItsNameIsRefusedWithTheFix) {
  TestDaemon d;
  TempDir target;  // the user's own, 0700: what the old check accepted
  ASSERT_EQ(symlink(target.path().c_str(), d.run_dir().c_str()), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(lchown(d.run_dir().c_str(), kNobody, kNobody), 0);
  }
  ExpectRefused(d, {d.run_dir() + " is a symbolic link", "SHMCACHE_RUN_DIR"});
  EXPECT_TRUE(ListDir(target.path()).empty()) << "something was made through the link";
}

TEST(RunDir, ADirectoryOthersMayWriteIsRefused) {
  TestDaemon d;
  ASSERT_EQ(mkdir(d.run_dir().c_str(), 0700), 0);
  ASSERT_EQ(chmod(d.run_dir().c_str(), 0777), 0);
  ExpectRefused(d, {d.run_dir() + " is a directory", "mode 0777", "SHMCACHE_RUN_DIR"});
}

TEST(RunDir, AnotherUsersDirectoryIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another uid";
  TestDaemon d;
  ASSERT_EQ(mkdir(d.run_dir().c_str(), 0700), 0);
  ASSERT_EQ(chown(d.run_dir().c_str(), kNobody, kNobody), 0);
  ExpectRefused(d, {"owned by nobody (uid 65534)", "SHMCACHE_RUN_DIR"});
}

// One of the user's own that others may only read (mkdir -p made it 0755):
// made 0700, and the server starts.
TEST(RunDir, OneOfOursOthersMayReadIsMadeOwnerOnly) {
  TestDaemon d;
  ASSERT_EQ(mkdir(d.run_dir().c_str(), 0700), 0);
  ASSERT_EQ(chmod(d.run_dir().c_str(), 0755), 0);
  ASSERT_TRUE(d.Start().ok());
  struct stat st {};
  ASSERT_EQ(lstat(d.run_dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(d.Stop().ok());
}

// What the server cannot remove at the socket's name (a directory: a dead
// server leaves a socket) is named, not told as an address in use.
TEST(RunDir, WhatCannotBeRemovedAtTheSocketsNameIsNamed) {
  TestDaemon d;
  ASSERT_EQ(mkdir(d.run_dir().c_str(), 0700), 0);
  const std::string sock = d.run_dir() + fmt::format("/shmcached-{}.sock", d.port());
  ASSERT_EQ(mkdir(sock.c_str(), 0700), 0);
  Status s = d.Start();
  ASSERT_FALSE(s.ok()) << "the server started";
  EXPECT_NE(s.message().find(sock + " is not a socket"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("remove it"), std::string::npos) << s.message();
  EXPECT_EQ(rmdir(sock.c_str()), 0);
}

// A process of another uid listening at the socket's place (what a
// repointed link leads to) is refused before the client sends it a byte.
TEST(RunDir, TheClientRefusesAListenerOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a listener as another uid";
  TestDaemon d;  // not started: its port and run dir only
  ASSERT_EQ(mkdir(d.run_dir().c_str(), 0700), 0);
  const std::string sock = fmt::format("{}/shmcached-{}.sock", d.run_dir(), d.port());
  struct Shared {
    std::atomic<int> listening{0};
    std::atomic<int> closed{0};  // connections read to their end
    std::atomic<long> bytes{0};  // what clients sent it
  };
  Shared* sh = SharedBlock<Shared>();
  pid_t fake = ForkChild([&]() -> int {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
    // Bound where root may, listening as nobody: SO_PEERCRED reports the
    // credentials of listen().
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        setresgid(kNobody, kNobody, kNobody) != 0 ||
        setresuid(kNobody, kNobody, kNobody) != 0 || listen(fd, 8) != 0) {
      return 2;
    }
    sh->listening.store(1);
    for (;;) {
      int c = accept(fd, nullptr, nullptr);
      if (c < 0) continue;
      char buf[4096];
      ssize_t n = 0;
      while ((n = read(c, buf, sizeof buf)) > 0) sh->bytes.fetch_add(n);
      close(c);
      sh->closed.fetch_add(1);
    }
  });
  ASSERT_GT(fake, 0);
  ASSERT_TRUE(WaitFor([&] { return sh->listening.load() == 1 || ProcessExited(fake); },
                      std::chrono::seconds(10)));
  ASSERT_EQ(sh->listening.load(), 1) << "the fake listener did not start";

  std::unique_ptr<Client> client;
  Status s = Client::Connect(d.client_options(), &client);
  EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
  EXPECT_NE(s.message().find("runs as nobody (uid 65534)"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("SHMCACHE_RUN_DIR"), std::string::npos) << s.message();
  client.reset();
  EXPECT_TRUE(WaitFor([&] { return sh->closed.load() >= 1; }, std::chrono::seconds(10)));
  EXPECT_EQ(sh->bytes.load(), 0) << "the client talked to another user's process";
  KillAndReap(fake);
  unlink(sock.c_str());
}

}  // namespace
}  // namespace shmcache::test
