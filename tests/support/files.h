// Files and directories of tests: temporary directories, listings, and
// removing what a test made.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace shmcache::test {

// Base for test run dirs: $SHMCACHE_RUN_DIR (scripts/test.sh), else /tmp.
std::string TestTmpRoot();
// A fresh directory named parent/prefix.XXXXXX; "" (and a test failure)
// when it cannot be made.
std::string MakeTempDir(const std::string& parent, const std::string& prefix);

// The name prefix of a directory the tests make where other test runs on
// the host make theirs (/dev/shm; kind: "shmcache-test", "shmcache-rel",
// "shmcache-reld"): kind.<tag> under a leak check, which sets
// SHMCACHE_LEAK_TAG (scripts/lib/leak_check_cpp.py) and takes only the
// dirs that carry its tag for its own; kind otherwise. Another run's dir,
// made while the check ran and with no server in it yet, is not this
// run's leftover.
std::string TaggedPrefix(const std::string& kind);

// A directory made with mkdtemp under `parent`, named
// TaggedPrefix("shmcache-rel").XXXXXX (the process aborts when it cannot
// be made); removed recursively by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& parent = "/tmp");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Removes `path` and, for a directory, everything under it (symbolic links
// are removed, not followed). Nothing when it does not exist.
void RemoveTree(const std::string& path);
// `path` (a directory this process made, with a unique name) is removed,
// and a mount on it detached, when this process dies before it was
// removed with RemoveTree: a test killed (a timeout, a crash, SIGKILL)
// leaves no temporary dir or small tmpfs behind. MakeTempDir and TempDir
// register theirs. A guard process does it once this process and the
// children it forked without exec have all ended.
void RemovedIfThisProcessDies(const std::string& path);
// Names (not paths) in dir, sorted; empty when it does not exist.
std::vector<std::string> ListDir(const std::string& dir);
bool PathExists(const std::string& path);
// The contents of every file in dir (names in ListDir's order, those
// starting with '.' skipped), concatenated: a log dir read whole.
std::string ReadFilesIn(const std::string& dir);

// The names in shm_dir of an instance's files: those starting with the
// prefix "shmcache.<uid>.<port>." (instance.h).
std::string InstancePrefix(unsigned uid, int port);

// Removes what a killed daemon left: runs `remove` (its segments, its
// huge-page tmpfs) while holding its host lock `lock_path`, as a starting
// daemon would, and then removes the lock file, last, as a stopped daemon
// does. No daemon starts on the port in between, and a leak check of
// another run that sees the instance's files or mount (leak_check_cpp.py)
// sees the lock that names their run dir until they are gone. Nothing is
// run when there is no lock (a stopped daemon removed everything, the lock
// last) or a live process holds it (another run's daemon took the port).
void RemoveKilledInstance(const std::string& lock_path,
                          const std::function<void()>& remove);
// True when /dev/shm shows the instance port taken by any user: a host
// lock file (".shmcache.<uid>.<port>.lock", live or left by a killed
// daemon) or files named "shmcache.<uid>.<port>.*". Other test runs on the
// host pick ports too; a port this says is free can still be taken before
// a server starts on it.
bool PortTakenOnHost(int port);
std::vector<std::string> InstanceFiles(const std::string& shm_dir,
                                       const std::string& prefix);

}  // namespace shmcache::test
