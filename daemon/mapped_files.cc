#include "daemon/mapped_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "format/parse_number.h"

namespace shmcache {

bool StatFile(const std::string& path, FileId* id, uint64_t* bytes) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  *id = FileId{st.st_dev, st.st_ino};
  *bytes = static_cast<uint64_t>(st.st_size);
  return true;
}

namespace {

constexpr char kDeleted[] = " (deleted)\n";
constexpr size_t kDeletedLen = sizeof(kDeleted) - 1;

// Adds to *found the files of `want` that a maps file shows; true when it
// showed any. Only lines of unlinked files are parsed: an inode number
// reused by a live file must not pass for ours.
bool ScanMaps(FILE* f, const std::set<FileId>& want, std::set<FileId>* found) {
  bool any = false;
  char* line = nullptr;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, f)) > 0) {
    size_t len = static_cast<size_t>(n);
    if (len < kDeletedLen ||
        std::memcmp(line + len - kDeletedLen, kDeleted, kDeletedLen) != 0) {
      continue;
    }
    // start-end perms offset major:minor inode path
    unsigned major_no = 0, minor_no = 0;
    unsigned long long ino = 0;
    if (std::sscanf(line, "%*s %*s %*s %x:%x %llu", &major_no, &minor_no, &ino) != 3) {
      continue;
    }
    FileId id{makedev(major_no, minor_no), ino};
    if (want.count(id) != 0) {
      found->insert(id);
      any = true;
    }
  }
  std::free(line);
  return any;
}

class Scanner {
 public:
  Scanner(std::span<const FileId> wanted, int proc)
      : want_(wanted.begin(), wanted.end()), proc_(proc), me_(geteuid()) {}
  bool done() const { return out_.mapped.size() == want_.size(); }
  MappedScan& result() { return out_; }

  void Scan(const char* pid) {
    struct stat st;
    if (fstatat(proc_, pid, &st, 0) != 0 || st.st_uid != me_) return;
    int fd = openat(proc_, (std::string(pid) + "/maps").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // exited meanwhile
    FILE* f = fdopen(fd, "r");
    if (f == nullptr) {
      close(fd);
      return;
    }
    long n = 0;
    if (ScanMaps(f, want_, &out_.mapped) && ParseDecimal(pid, 1, INT_MAX, &n)) {
      out_.holders.push_back(static_cast<int>(n));
    }
    std::fclose(f);
  }

 private:
  std::set<FileId> want_;
  int proc_;
  uid_t me_;
  MappedScan out_;
};

}  // namespace

MappedScan FindMappedDeleted(std::span<const FileId> wanted, std::span<const int> first) {
  DIR* proc = wanted.empty() ? nullptr : opendir("/proc");
  if (proc == nullptr) return {};
  Scanner scan(wanted, dirfd(proc));
  for (int pid : first) {
    if (scan.done()) break;
    scan.Scan(std::to_string(pid).c_str());
  }
  while (dirent* e = scan.done() ? nullptr : readdir(proc)) {
    long pid = 0;
    if (!ParseDecimal(e->d_name, 1, INT_MAX, &pid)) continue;  // not a process
    if (std::find(first.begin(), first.end(), pid) != first.end()) {
      continue;  // read above
    }
    scan.Scan(e->d_name);
  }
  closedir(proc);
  return std::move(scan.result());
}

}  // namespace shmcache
