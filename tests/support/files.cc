#include "tests/support/files.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace shmcache::test {

namespace fs = std::filesystem;

namespace {

// The write end of the pipe to the guard of this process's temporary
// paths (RemovedIfThisProcessDies), started at the first use. The guard
// runs in a session of its own (a group kill, meson's on a timeout,
// spares it) and holds only the read end; this process holds the write
// end, and so do the children it forks without exec, until they end. It
// reads "+path" and "-path" lines; once the pipe's last writer is gone,
// however it ended, it detaches a mount at each path still listed and
// removes the path (rm -rf). -1 when it could not be started.
int GuardPipe() {
  static const int fd = [] {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    const pid_t pid = fork();
    if (pid < 0) {
      close(fds[0]);
      close(fds[1]);
      return -1;
    }
    if (pid == 0) {
      // Only the read end: a copy of the test's sockets or of meson's
      // output pipe would change what the test, or meson, sees. No lock
      // is taken but malloc's, which glibc makes usable in the child of a
      // process with threads (no streams: their locale's lock).
      setsid();
      dup2(fds[0], 0);
      close_range(1, ~0U, 0);
      std::string lines;
      char buf[4096];
      for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        lines.append(buf, static_cast<size_t>(n));
      }
      std::vector<std::string> paths;
      for (size_t at = 0, end; (end = lines.find('\n', at)) != std::string::npos;
           at = end + 1) {
        if (end - at < 2) continue;
        const std::string path = lines.substr(at + 1, end - at - 1);
        auto listed = std::find(paths.begin(), paths.end(), path);
        if (lines[at] == '+' && listed == paths.end()) paths.push_back(path);
        if (lines[at] == '-' && listed != paths.end()) paths.erase(listed);
      }
      if (paths.empty()) _exit(0);
      std::vector<char*> argv = {const_cast<char*>("rm"), const_cast<char*>("-rf"),
                                 const_cast<char*>("--")};
      for (std::string& p : paths) {
        umount2(p.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
        argv.push_back(p.data());
      }
      argv.push_back(nullptr);
      execv("/bin/rm", argv.data());
      _exit(127);
    }
    close(fds[0]);
    return fds[1];
  }();
  return fd;
}

// Writes `line` to the guard. SIGPIPE (a guard gone: killed by hand) is
// blocked for the write and taken if the write raised it.
void TellGuard(const std::string& line) {
  const int fd = GuardPipe();
  if (fd < 0) return;
  sigset_t pipe_only, old;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  // One write, at most PIPE_BUF bytes: whole, whichever process writes.
  ssize_t n;
  do {
    n = write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EPIPE) {
    const timespec now{0, 0};
    sigtimedwait(&pipe_only, nullptr, &now);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

// mkdtemp of parent/prefix.XXXXXX; "" and *error set when it fails.
std::string MakeDir(const std::string& parent, const std::string& prefix,
                    std::string* error) {
  std::string templ = parent + "/" + prefix + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    *error = "mkdtemp " + templ + ": " + std::strerror(errno);
    return "";
  }
  RemovedIfThisProcessDies(templ);
  return templ;
}

}  // namespace

void RemovedIfThisProcessDies(const std::string& path) {
  if (!path.empty() && path.size() < PIPE_BUF - 2) TellGuard("+" + path + "\n");
}

std::string TestTmpRoot() {
  const char* p = std::getenv("SHMCACHE_RUN_DIR");
  if (p && *p && PathExists(p)) return p;
  return "/tmp";
}

std::string MakeTempDir(const std::string& parent, const std::string& prefix) {
  std::string error;
  std::string dir = MakeDir(parent, prefix, &error);
  if (dir.empty()) ADD_FAILURE() << error;
  return dir;
}

std::string TaggedPrefix(const std::string& kind) {
  const char* tag = std::getenv("SHMCACHE_LEAK_TAG");
  return tag != nullptr && *tag != '\0' ? kind + "." + tag : kind;
}

TempDir::TempDir(const std::string& parent) {
  std::string error;
  path_ = MakeDir(parent, TaggedPrefix("shmcache-rel"), &error);
  if (path_.empty()) {
    fprintf(stderr, "%s\n", error.c_str());
    std::abort();
  }
}

TempDir::~TempDir() { RemoveTree(path_); }

void RemoveTree(const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  fs::remove_all(path, ec);
  if (path.size() < PIPE_BUF - 2) TellGuard("-" + path + "\n");
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::string ReadFilesIn(const std::string& dir) {
  std::string all;
  for (const std::string& n : ListDir(dir)) {
    if (n[0] == '.') continue;
    std::ifstream in(dir + "/" + n, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    all += ss.str();
  }
  return all;
}

std::string InstancePrefix(unsigned uid, int port) {
  return "shmcache." + std::to_string(uid) + "." + std::to_string(port) + ".";
}

std::vector<std::string> InstanceFiles(const std::string& shm_dir,
                                       const std::string& prefix) {
  std::vector<std::string> mine;
  for (const std::string& n : ListDir(shm_dir)) {
    if (n.rfind(prefix, 0) == 0) mine.push_back(n);
  }
  return mine;
}

void RemoveKilledInstance(const std::string& lock_path,
                          const std::function<void()>& remove) {
  int fd = open(lock_path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat held {};
  struct stat now {};
  // Still the file at that name once locked: one unlinked in between (by
  // another run's clean-up) may have been replaced by a live daemon's.
  if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &held) == 0 &&
      lstat(lock_path.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
      held.st_ino == now.st_ino) {
    remove();
    unlink(lock_path.c_str());
  }
  close(fd);
}

bool PortTakenOnHost(int port) {
  // Built by appends: gcc 12 warns (-Wrestrict, a false positive) on
  // "literal" + std::string&&.
  std::string tail(1, '.');
  tail += std::to_string(port);
  tail += '.';
  for (const std::string& name : ListDir("/dev/shm")) {
    // ".shmcache.<uid>.<port>.lock" or "shmcache.<uid>.<port>.<rest>"
    size_t at = name.rfind(".shmcache.", 0) == 0  ? 10
                : name.rfind("shmcache.", 0) == 0 ? 9
                                                  : std::string::npos;
    if (at == std::string::npos) continue;
    size_t uid_end = name.find('.', at);
    if (uid_end != std::string::npos && uid_end > at &&
        name.compare(uid_end, tail.size(), tail) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace shmcache::test
