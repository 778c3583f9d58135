#include "format/owned_dir.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "format/shell_quote.h"

namespace shmcache {

std::string OwnerName(uid_t uid) {
  passwd pw;
  passwd* found = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr) {
    return fmt::format("{} (uid {})", found->pw_name, uid);
  }
  return fmt::format("uid {}", uid);
}

static std::string KindOf(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISREG(mode)) return "a regular file";
  return "a special file";
}

static std::string Describe(const struct stat& st) {
  std::string what =
      fmt::format("{} owned by {}", KindOf(st.st_mode), OwnerName(st.st_uid));
  if (!S_ISLNK(st.st_mode)) what += fmt::format(", mode {:04o}", st.st_mode & 07777);
  return what;
}

std::string DescribeEntry(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return "nothing";
  return Describe(st);
}

namespace {

constexpr mode_t kOthersWrite = S_IWGRP | S_IWOTH;

Status NotOurs(const std::string& path, const std::string& what, const std::string& fix) {
  return Status::PermissionDenied(
      fmt::format("{} is {}: not this user's own directory, refusing to use it; {}", path,
                  what, fix));
}

// Ours, but others may write into it: its mode is what is wrong (it was
// told as "not this user's own directory", which root's own 0777 directory
// is). Not tightened here: what others put there may already be waiting. A
// sticky one is a shared directory such as /tmp, never to be made 0700.
Status OpenToOthers(const std::string& path, const struct stat& st,
                    const std::string& fix) {
  const std::string why = fmt::format(
      "{} is {}: other users may write into it, refusing to use it", path, Describe(st));
  if ((st.st_mode & S_ISVTX) != 0) {
    return Status::PermissionDenied(fmt::format("{} (a shared directory); {}", why, fix));
  }
  return Status::PermissionDenied(fmt::format(
      "{}; if nothing in it is another user's, make it yours alone with 'chmod 700 {}', "
      "or {}",
      why, ShellQuote(path), fix));
}

// The directory `path` is in ("/" for "/x", "." for "x"), without the
// trailing slashes of either.
std::string Parent(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  path.resize(slash);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path.empty() ? "/" : path;
}

}  // namespace

Status OpenOwnedDir(const std::string& path, bool create, const std::string& fix,
                    int* fd_out, std::string* tightened) {
  if (tightened != nullptr) tightened->clear();
  if (create && mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    // EACCES: a parent closed to this user (another user's run dir tree);
    // the fix says where to go instead.
    if (errno == EACCES) {
      return Status::PermissionDenied(
          fmt::format("cannot create {}: a directory above it is closed to this user; {}",
                      path, fix));
    }
    // ENOENT: a directory above it is missing (SHMCACHE_RUN_DIR=/scratch/
    // $USER/shmcache before /scratch/$USER exists): said with the fix, not
    // as a bare "No such file or directory".
    if (errno == ENOENT) {
      const std::string parent = Parent(path);
      return Status::IOError(fmt::format(
          "cannot create {}: the directory above it, {}, does not exist; create it "
          "first ('mkdir -p {}')",
          path, parent, ShellQuote(parent)));
    }
    return Status::FromErrno("cannot create " + path, errno);
  }
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return Status::NotFound(path + " does not exist");
    // EACCES: another user's directory closed to us; told as one we may
    // open, with the fix, not as a bare "Permission denied".
    struct stat st {};
    if (e == ELOOP || e == ENOTDIR || (e == EACCES && lstat(path.c_str(), &st) == 0)) {
      return NotOurs(path, DescribeEntry(path), fix);
    }
    return Status::FromErrno("cannot open " + path, e);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return Status::FromErrno("cannot stat " + path, e);
  }
  // Another user's directory, or ours that others may write: what is in it
  // may be theirs (a link where a file of ours will be looked for).
  if (st.st_uid != geteuid()) {
    close(fd);
    return NotOurs(path, Describe(st), fix);
  }
  if ((st.st_mode & kOthersWrite) != 0) {
    close(fd);
    return OpenToOthers(path, st, fix);
  }
  if ((st.st_mode & 07777) != 0700) {
    if (fchmod(fd, 0700) != 0) {
      int e = errno;
      close(fd);
      return Status::FromErrno("cannot make " + path + " mode 0700", e);
    }
    if (tightened != nullptr) {
      *tightened = fmt::format("{} was mode {:04o}: made 0700", path, st.st_mode & 07777);
    }
  }
  *fd_out = fd;
  return Status::OK();
}

Status CheckNoOtherUserCanReplace(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return Status::InvalidArgument(path + " is not an absolute path");
  }
  std::vector<std::string> names;
  for (size_t at = 1; at < path.size();) {
    size_t end = path.find('/', at);
    if (end == std::string::npos) end = path.size();
    if (end > at) names.push_back(path.substr(at, end - at));
    at = end + 1;
  }
  for (const std::string& n : names) {
    if (n == "." || n == "..") {
      return Status::InvalidArgument(path + " is not a canonical path");
    }
  }
  // O_PATH: a directory we may only search (a 0711 home) is checked too.
  int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("cannot open /", errno);
  std::string dir = "/";
  for (size_t i = 0;; ++i) {
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      int e = errno;
      close(fd);
      return Status::FromErrno("cannot stat " + dir, e);
    }
    std::string why;
    if (st.st_uid != 0 && st.st_uid != geteuid()) {
      why = "belongs to " + OwnerName(st.st_uid);
    } else if ((st.st_mode & kOthersWrite) != 0 && (st.st_mode & S_ISVTX) == 0) {
      why = fmt::format("may be written by others (mode {:04o}, not sticky)",
                        st.st_mode & 07777);
    }
    if (!why.empty()) {
      close(fd);
      return Status::PermissionDenied(fmt::format(
          "{} {}: another user could put a link of theirs in place of what {} names; "
          "use a directory whose every parent only root and you can change",
          dir, why, path));
    }
    if (i + 1 >= names.size()) break;  // the directory holding the last name
    int next =
        openat(fd, names[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int e = errno;
    close(fd);
    dir += (dir.size() > 1 ? "/" : "") + names[i];
    if (next < 0) {
      if (e == ENOTDIR || e == ELOOP) {
        return Status::PermissionDenied(
            fmt::format("{} is {}, not a directory: refusing to reach {} through it", dir,
                        DescribeEntry(dir), path));
      }
      return Status::FromErrno("cannot open " + dir, e);
    }
    fd = next;
  }
  close(fd);
  return Status::OK();
}

}  // namespace shmcache
