#include "tests/support/files.h"

#include <fcntl.h>
#include <sys/file.h>
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

// mkdtemp of parent/prefix.XXXXXX; "" and *error set when it fails.
std::string MakeDir(const std::string& parent, const std::string& prefix,
                    std::string* error) {
  std::string templ = parent + "/" + prefix + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    *error = "mkdtemp " + templ + ": " + std::strerror(errno);
    return "";
  }
  return templ;
}

}  // namespace

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
