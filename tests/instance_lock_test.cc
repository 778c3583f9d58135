// The instance lock (common/instance_lock.h): one server per instance, and
// the pid in the file read one way by the server that finds it taken and
// by the admin that stops a server still starting.
#include "common/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/process_state.h"
#include "tests/support/child_process.h"
#include "tests/support/test_server.h"
#include "tests/support/wait_for.h"

namespace shmcache {
namespace {
std::function<void()>* before_next_flock = nullptr;
}  // namespace
}  // namespace shmcache

// The interposed flock (see ReplacedBeforeTheFlock): runs the hook once.
extern "C" int flock(int fd, int operation) {
  if (std::function<void()>* hook = shmcache::before_next_flock) {
    shmcache::before_next_flock = nullptr;
    (*hook)();
  }
  return static_cast<int>(syscall(SYS_flock, fd, operation));
}

namespace shmcache {
namespace {

class InstanceLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::MakeTempDir(test::TestTmpRoot(), "lock");
    path_ = dir_ + "/shmcached-31000.lock";
  }
  void TearDown() override { test::RemoveTree(dir_); }

  int PidIn(const std::string& text) {
    { std::ofstream(path_, std::ios::trunc) << text; }
    int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    const ProcessIdentity owner = ReadLockOwner(fd);
    close(fd);
    return owner.pid;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(InstanceLockTest, ReadsThePidAServerWrote) {
  EXPECT_EQ(PidIn("4242 123 0d5c-9e\n"), 4242);
  EXPECT_EQ(PidIn("4242\n"), 4242) << "an older version's";
  EXPECT_EQ(PidIn(" 17\n"), 17);
}

// A line not written whole may be cut anywhere: "42" of "4242".
TEST_F(InstanceLockTest, ANonsenseOrUnfinishedPidIsNone) {
  for (const char* text :
       {"", "\n", "abc\n", "-5\n", "0\n", "99999999999\n", "x17", "4242", "4242 12"}) {
    EXPECT_EQ(PidIn(text), 0) << "'" << text << "'";
  }
}

TEST_F(InstanceLockTest, OneHolderAtATime) {
  bool held = true;
  ProcessIdentity owner{.pid = -1};
  ASSERT_TRUE(ProbeInstanceLock(path_, &held, &owner).ok()) << "no file: nobody holds it";
  EXPECT_FALSE(held);
  EXPECT_EQ(owner.pid, 0);

  int fd = -1;
  ASSERT_TRUE(TakeInstanceLock(path_, 31000, &fd).ok());
  ASSERT_TRUE(ProbeInstanceLock(path_, &held, &owner).ok());
  EXPECT_TRUE(held);
  EXPECT_EQ(owner.pid, getpid());
  // flock locks belong to the open file: a second open is a second server.
  int second = -1;
  Status s = TakeInstanceLock(path_, 31000, &second);
  EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
  EXPECT_NE(s.message().find("already running on port 31000 (process id " +
                             std::to_string(getpid()) + ")"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(second, -1);

  close(fd);  // the server is gone: the kernel dropped its lock
  ASSERT_TRUE(ProbeInstanceLock(path_, &held, &owner).ok());
  EXPECT_FALSE(held);
  ASSERT_TRUE(TakeInstanceLock(path_, 31000, &fd).ok());
  close(fd);
}

TEST_F(InstanceLockTest, ALockTakenBeforeItsPidIsWrittenNamesNone) {
  int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  int other = -1;
  Status s = TakeInstanceLock(path_, 31000, &other);
  EXPECT_NE(s.message().find("(process id ?)"), std::string::npos) << s.message();
  bool held = false;
  ProcessIdentity owner{.pid = -1};
  ASSERT_TRUE(ProbeInstanceLock(path_, &held, &owner).ok());
  EXPECT_TRUE(held);
  EXPECT_EQ(owner.pid, 0);
  close(fd);
}

// Both locks record their holder's start and boot beside its pid, as the
// kernel gives them, and the host lock keeps them when the shm dir is
// noted: what tells the holder from a later process given its pid.
TEST_F(InstanceLockTest, TheLocksRecordTheirHoldersStartAndBoot) {
  const std::string host = dir_ + "/.shmcache.lock";
  std::unique_ptr<InstanceLocks> locks;
  ASSERT_TRUE(InstanceLocks::Take(path_, host, 31000, "/run/a", &locks).ok());
  std::string boot;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
  ASSERT_FALSE(boot.empty());
  const uint64_t start = ProcessStartTicks(getpid());
  ASSERT_GT(start, 0u);
  bool held = false;
  ProcessIdentity owner;
  ASSERT_TRUE(ProbeInstanceLock(path_, &held, &owner).ok());
  EXPECT_TRUE(held);
  EXPECT_EQ(owner.pid, getpid());
  EXPECT_EQ(owner.start_ticks, start);
  EXPECT_EQ(owner.boot_id, boot);
  locks->NoteShmDir("/dev/shm/x");
  HostLockHolder holder;
  ASSERT_TRUE(ProbeHostLock(host, &holder).ok());
  EXPECT_EQ(holder.owner.pid, getpid());
  EXPECT_EQ(holder.owner.start_ticks, start);
  EXPECT_EQ(holder.owner.boot_id, boot);
  EXPECT_EQ(holder.run_dir, "/run/a");
  locks->RemoveFiles();
}

// A server that has just taken the lock (here: this test, holding it) has
// not yet written over the previous holder's text, whose process ended:
// the start refused names no process id, where it named the ended one's
// (which may be another process's by then).
TEST_F(InstanceLockTest, AStartRefusedNamesNotTheEndedPreviousHolder) {
  const pid_t ended = test::Sleeper();
  {
    const std::string text = fmt::format("{} {} {}\n", ended, ProcessStartTicks(ended),
                                         SelfIdentity().boot_id);
    std::ofstream(path_, std::ios::trunc) << text;
  }
  test::KillAndReap(ended);
  const int fd = open(path_.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  int other = -1;
  Status s = TakeInstanceLock(path_, 31000, &other);
  close(fd);
  EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
  EXPECT_NE(s.message().find("(process id ?)"), std::string::npos) << s.message();
  if (other >= 0) close(other);
}

// A server killed (or crashed) turns zombie before its other threads have
// exited, and they hold its lock until the last is gone. A restart in that
// while waits for them instead of refusing: here the holder's leader has
// ended while a thread of it lives on, and that thread ends only once the
// starter has found the lock held and tries again (the flock hook), so a
// starter that refused at once would fail this.
TEST_F(InstanceLockTest, AStartWaitsForAnEndingHolderToLetGo) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const pid_t holder = test::ForkChild([&] {
    close(pipe_fds[1]);
    int fd = -1;
    if (!TakeInstanceLock(path_, 31000, &fd).ok()) return 1;
    std::thread([read_end = pipe_fds[0]] {
      char c = 0;
      (void)!read(read_end, &c, 1);  // until the starter lets it end
      _exit(0);
    }).detach();
    syscall(SYS_exit, 0);  // the leader alone ends, as a killed one first does
    return 2;
  });
  ASSERT_GT(holder, 0);
  close(pipe_fds[0]);
  ASSERT_TRUE(test::WaitFor([&] { return ProcessEnding(holder); }))
      << "the holder's leader ended, a thread of it lives on";
  int write_end = pipe_fds[1];
  std::function<void()> holder_ends = [&] { close(write_end); };
  std::function<void()> then_holder_ends = [&] { before_next_flock = &holder_ends; };
  before_next_flock = &then_holder_ends;  // the second flock: after a refusal
  int fd = -1;
  Status s = TakeInstanceLock(path_, 31000, &fd);
  if (before_next_flock != nullptr) close(write_end);
  before_next_flock = nullptr;
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(test::WaitChild(holder), 0);
  if (fd >= 0) close(fd);
}

// A reader's shared lock (ProbeLock's, a moment long: a client whose
// connect failed asks which server holds the port, and so does --stop) is
// no server: a start that meets it takes the lock a moment later. Both
// locks were refused so, as "already running (process id ?)" (1 start in
// 10 against a reader probing in a loop).
TEST_F(InstanceLockTest, AReadersSharedLockDoesNotRefuseAStart) {
  for (bool host : {false, true}) {
    SCOPED_TRACE(host ? "host lock" : "instance lock");
    const std::string path = host ? dir_ + "/.shmcache.lock" : path_;
    int reader = open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(reader, 0);
    ASSERT_EQ(flock(reader, LOCK_SH | LOCK_NB), 0);
    std::function<void()> reader_lets_go = [&] {
      close(reader);
      reader = -1;
    };
    std::function<void()> then_reader_lets_go = [&] {
      before_next_flock = &reader_lets_go;
    };
    before_next_flock = &then_reader_lets_go;  // the second flock: after a refusal
    int fd = -1;
    Status s = host ? TakeHostLock(path, 31000, "/run/a", &fd)
                    : TakeInstanceLock(path, 31000, &fd);
    before_next_flock = nullptr;
    if (reader >= 0) close(reader);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (fd >= 0) close(fd);
  }
}

// A server that stops unlinks its lock file while holding it. A starter
// that opened the file just before flocks it once it is released: a file no
// longer at the path, that guards nothing, while the next starter makes a
// new file at the path and locks that. flock is interposed here (this
// binary's definition wins over libc's) to run that stop and that next
// start between the starter's open and its flock.
void ReplacedBeforeTheFlock(const std::string& path, bool host) {
  int stopping = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(stopping, 0);
  ASSERT_EQ(flock(stopping, LOCK_EX | LOCK_NB), 0);
  int next = -1;
  std::function<void()> stop_then_start = [&] {
    ReleaseLockFile(path, stopping);  // the stopping server: unlink, then exit
    close(stopping);
    next = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);  // the next one
    ASSERT_EQ(flock(next, LOCK_EX | LOCK_NB), 0);
  };
  before_next_flock = &stop_then_start;
  int fd = -1;
  Status s = host ? TakeHostLock(path, 31000, "/run/x", &fd)
                  : TakeInstanceLock(path, 31000, &fd);
  before_next_flock = nullptr;
  EXPECT_GE(next, 0) << "the hook ran";
  EXPECT_TRUE(s.IsAlreadyExists()) << "a lock taken on the unlinked file while the "
                                      "next server holds the one at the path: "
                                   << s.ToString();
  if (fd >= 0) close(fd);
  close(next);
}

TEST_F(InstanceLockTest, ALockFileUnlinkedBeforeTheFlockIsNotTakenTheInstanceLock) {
  ReplacedBeforeTheFlock(path_, false);
}

TEST_F(InstanceLockTest, ALockFileUnlinkedBeforeTheFlockIsNotTakenTheHostLock) {
  ReplacedBeforeTheFlock(dir_ + "/.shmcache.lock", true);
}

// The host lock (HostLockPath): one server of a user and port, whatever
// its run dir, in a directory other users can write.
TEST_F(InstanceLockTest, TheHostLockNamesTheHolderAndItsRunDir) {
  std::string host = dir_ + "/.shmcache.lock";
  int fd = -1;
  ASSERT_TRUE(TakeHostLock(host, 31000, "/run/a", &fd).ok());
  int second = -1;
  Status s = TakeHostLock(host, 31000, "/run/b", &second);
  EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
  EXPECT_NE(s.message().find("already running on port 31000 (process id " +
                             std::to_string(getpid()) + ", run dir /run/a)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(second, -1);
  ReleaseLockFile(host, fd);
  close(fd);
  EXPECT_NE(access(host.c_str(), F_OK), 0) << "a stopped server removes its host lock";
  ASSERT_TRUE(TakeHostLock(host, 31000, "/run/b", &fd).ok());
  close(fd);  // killed: the file stays, the lock goes with the process
  ASSERT_TRUE(TakeHostLock(host, 31000, "/run/c", &fd).ok());
  close(fd);
}

TEST_F(InstanceLockTest, TheHostLockNeverFollowsALink) {
  std::string target = dir_ + "/victim";
  { std::ofstream(target) << "precious\n"; }
  std::string host = dir_ + "/.shmcache.lock";
  ASSERT_EQ(symlink(target.c_str(), host.c_str()), 0);
  int fd = -1;
  Status s = TakeHostLock(host, 31000, "/run/a", &fd);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(fd, -1);
  std::ifstream in(target);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "precious") << "the link's target was written";
}

// The run dir is the user's own, but whatever a link there points to (as
// root: any file of the system) is not the server's to truncate.
TEST_F(InstanceLockTest, TheInstanceLockNeverFollowsALink) {
  std::string target = dir_ + "/victim";
  { std::ofstream(target) << "precious\n"; }
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  int fd = -1;
  Status s = TakeInstanceLock(path_, 31000, &fd);
  EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
  EXPECT_NE(s.message().find("not a regular file"), std::string::npos) << s.message();
  EXPECT_EQ(fd, -1);
  if (fd >= 0) close(fd);
  std::ifstream in(target);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "precious") << "the link's target was written";
}

TEST_F(InstanceLockTest, AHostLockOfAnotherUserIsRefusedByName) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another user";
  std::string host = dir_ + "/.shmcache.lock";
  { std::ofstream(host) << ""; }
  ASSERT_EQ(chown(host.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(host.c_str(), 0666), 0);
  int fd = -1;
  Status s = TakeHostLock(host, 31000, "/run/a", &fd);
  EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
  EXPECT_NE(s.message().find("uid 65534"), std::string::npos) << s.message();
  EXPECT_EQ(fd, -1);
}

// A host lock file another user planted (the directory is open to all)
// is no server of this user's, held or not, whatever it says: --stop once
// named "a server of yours" with the run dir written in it.
TEST_F(InstanceLockTest, AHostLockOfAnotherUserNamesNoHolder) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another user";
  const std::string host = dir_ + "/.shmcache.lock";
  const int fd = open(host.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  const std::string text = "4242\n/run/planted\n/dev/shm/planted\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ASSERT_EQ(fchown(fd, 65534, 65534), 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  HostLockHolder holder;
  EXPECT_TRUE(ProbeHostLock(host, &holder).ok());
  EXPECT_FALSE(holder.held);
  EXPECT_EQ(holder.owner.pid, 0);
  EXPECT_EQ(holder.run_dir, "");
  EXPECT_EQ(holder.shm_dir, "");
  close(fd);
}

// A link or a socket at a lock's name (a neighbour's, where the run dir
// was removed and made again by them; /dev/shm is open to all) is no lock
// of this user's servers: nobody holds it, as the header says, where the
// probe's open failed (ELOOP, ENXIO) and --stop gave up with that error.
TEST_F(InstanceLockTest, ALinkOrASocketAtALocksNameIsHeldByNobody) {
  std::string target = dir_ + "/held";
  int fd = -1;
  ASSERT_TRUE(TakeHostLock(target, 31000, "/run/a", &fd).ok());
  const std::string host = dir_ + "/.shmcache.lock";
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  ASSERT_EQ(symlink(target.c_str(), host.c_str()), 0);
  bool held = true;
  ProcessIdentity owner{.pid = -1};
  Status s = ProbeInstanceLock(path_, &held, &owner);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(held);
  EXPECT_EQ(owner.pid, 0);
  HostLockHolder holder;
  s = ProbeHostLock(host, &holder);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(holder.held);
  EXPECT_EQ(holder.run_dir, "");
  close(fd);
  ASSERT_EQ(unlink(path_.c_str()), 0);
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path_.size(), sizeof addr.sun_path);
  path_.copy(addr.sun_path, path_.size());
  ASSERT_EQ(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << path_;
  s = ProbeInstanceLock(path_, &held, &owner);
  close(sock);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(held);
}

// Another user's file, which this user may not open (EACCES): no lock of
// this user's either.
TEST_F(InstanceLockTest, AnotherUsersUnreadableFileAtALocksNameIsHeldByNobody) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another user";
  // User 65534 must reach the file's dir: the test root may be a 0700 dir
  // of root's (scripts/test.sh's SHMCACHE_RUN_DIR), so this one is in /tmp.
  struct RemovedAtEnd {
    std::string dir;
    ~RemovedAtEnd() { test::RemoveTree(dir); }
  } other{test::MakeTempDir("/tmp", "lock-other")};
  ASSERT_EQ(chmod(other.dir.c_str(), 0755), 0);
  const std::string path = other.dir + "/shmcached-31000.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchown(fd, 65533, 65533), 0);
  close(fd);
  // Probed as user 65534, in a child (setuid cannot be undone).
  pid_t child = test::ForkChild([&] {
    if (setgid(65534) != 0 || setuid(65534) != 0) return 2;
    bool held = true;
    ProcessIdentity owner{.pid = -1};
    Status s = ProbeInstanceLock(path, &held, &owner);
    if (!s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      return 3;
    }
    return held ? 4 : 0;
  });
  EXPECT_EQ(test::WaitChild(child), 0);
}

// The host lock names its holder's run dir from the start, and its shm dir
// once the server has chosen it (NoteShmDir).
TEST_F(InstanceLockTest, TheHostLockNamesTheShmDirOnceNoted) {
  const std::string host = dir_ + "/.shmcache.lock";
  std::unique_ptr<InstanceLocks> locks;
  ASSERT_TRUE(InstanceLocks::Take(path_, host, 31000, "/run/a", &locks).ok());
  HostLockHolder holder;
  ASSERT_TRUE(ProbeHostLock(host, &holder).ok());
  EXPECT_TRUE(holder.held);
  EXPECT_EQ(holder.owner.pid, getpid());
  EXPECT_EQ(holder.run_dir, "/run/a");
  EXPECT_EQ(holder.shm_dir, "") << "not chosen yet";
  locks->NoteShmDir("/dev/shm/x");
  ASSERT_TRUE(ProbeHostLock(host, &holder).ok());
  EXPECT_TRUE(holder.held);
  EXPECT_EQ(holder.owner.pid, getpid());
  EXPECT_EQ(holder.run_dir, "/run/a");
  EXPECT_EQ(holder.shm_dir, "/dev/shm/x");
  locks->RemoveFiles();
}

// InstanceLocks: both locks for the object's life; RemoveFiles, as a
// server that stops, removes both files while holding them.
TEST_F(InstanceLockTest, InstanceLocksHoldBothUntilDestroyed) {
  const std::string host = dir_ + "/.shmcache.lock";
  std::unique_ptr<InstanceLocks> first;
  ASSERT_TRUE(InstanceLocks::Take(path_, host, 31000, "/run/a", &first).ok());
  std::unique_ptr<InstanceLocks> second;
  EXPECT_TRUE(
      InstanceLocks::Take(path_, host, 31000, "/run/b", &second).IsAlreadyExists());
  // The host lock alone taken elsewhere: the instance lock is given back.
  const std::string other = dir_ + "/shmcached-31001.lock";
  EXPECT_TRUE(
      InstanceLocks::Take(other, host, 31000, "/run/b", &second).IsAlreadyExists());
  int fd = -1;
  ASSERT_TRUE(TakeInstanceLock(other, 31001, &fd).ok()) << "released on failure";
  close(fd);
  EXPECT_EQ(second, nullptr);
  first.reset();  // a failed start: files stay, locks go
  EXPECT_TRUE(test::PathExists(path_));
  EXPECT_TRUE(test::PathExists(host));
  ASSERT_TRUE(InstanceLocks::Take(path_, host, 31000, "/run/b", &second).ok());
  second->RemoveFiles();  // a server that stops
  EXPECT_FALSE(test::PathExists(path_));
  EXPECT_FALSE(test::PathExists(host));
}

}  // namespace
}  // namespace shmcache
