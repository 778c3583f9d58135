#include "common/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "common/process_state.h"
#include "format/shell_quote.h"

namespace shmcache {

namespace {

// Line `index` (0: the holder's identity) of what the lock file open as
// `fd` says; "" when it has not been written whole yet (no newline after
// it: "42" may be the start of "4242").
std::string ReadLockLine(int fd, int index) {
  char buf[8192] = {};
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  const std::string text(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (int i = 0; i < index; ++i) {
    start = text.find('\n', start);
    if (start == std::string::npos) return "";
    ++start;
  }
  const size_t end = text.find('\n', start);
  return end == std::string::npos ? "" : text.substr(start, end - start);
}

// The host lock's text: the holder's identity, run dir and, once it has
// chosen it, shm dir (NoteShmDir), then kServing once it listens
// (NoteServing), a line each. The instance lock's is the first line alone.
constexpr int kOwnerLine = 0;
constexpr int kRunDirLine = 1;
constexpr int kShmDirLine = 2;
constexpr int kServingLine = 3;
constexpr std::string_view kServing = "serving";

}  // namespace

ProcessIdentity ReadLockOwner(int fd) {
  return ParseIdentity(ReadLockLine(fd, kOwnerLine));
}

namespace {

// The text of the lock's first line for this process.
std::string OwnerLine() { return IdentityText(SelfIdentity()) + "\n"; }

// Why a lock file that is not this user's own regular file is refused.
Status NotOurs(const std::string& lock_path, const struct stat& st, int port) {
  if (st.st_uid != geteuid()) {
    return Status::PermissionDenied(fmt::format(
        "{} belongs to uid {}, not to this user: another user created it to take "
        "port {}; have it removed (as root) or use another port",
        lock_path, st.st_uid, port));
  }
  return Status::PermissionDenied(fmt::format(
      "{} is not a regular file (a link or a directory was put there); have it "
      "removed or use another port",
      lock_path));
}

// Opens (creating it) the lock file at lock_path: a regular file of this
// user, never reached through a link (the file is truncated and written: as
// root, a link could name any file of the system). *held: its fstat.
Status OpenLockFile(const std::string& lock_path, int port, int* fd_out,
                    struct stat* held) {
  int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    int err = errno;
    struct stat st {};
    if (lstat(lock_path.c_str(), &st) == 0 &&
        (!S_ISREG(st.st_mode) || st.st_uid != geteuid())) {
      return NotOurs(lock_path, st, port);
    }
    return Status::FromErrno("cannot open " + lock_path, err);
  }
  if (fstat(fd, held) != 0 || !S_ISREG(held->st_mode) || held->st_uid != geteuid()) {
    close(fd);
    return NotOurs(lock_path, *held, port);
  }
  *fd_out = fd;
  return Status::OK();
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// How long a start waits for a holder that is ending (ProcessEnding) to
// let go of the lock: a killed server's other threads exit, and unmap its
// segments, after its leader; a crash may dump core meanwhile.
constexpr auto kEndingHolderWait = std::chrono::seconds(10);

// Opens and flocks the lock file at lock_path and writes `text` into it
// (for messages; the lock is what matters). A holder that stops unlinks
// the file while holding it: a lock taken on a file that is no longer the
// one at the path guards nothing (the next server makes a new file and
// locks that), so it is taken again. A holder that is ending (killed, its
// last threads still exiting) is waited for: a restart right after a kill
// or a crash must not be refused. Another holder: busy(its open file),
// the AlreadyExists naming it.
Status LockFileAtPath(const std::string& lock_path, int port, const std::string& text,
                      const std::function<Status(int)>& busy, int* fd_out) {
  const auto wait_until = std::chrono::steady_clock::now() + kEndingHolderWait;
  for (int replaced = 0; replaced < 100;) {
    int fd = -1;
    struct stat held {};
    Status opened = OpenLockFile(lock_path, port, &fd, &held);
    if (!opened.ok()) return opened;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      // Readers alone hold it when a shared lock is granted: ProbeLock's,
      // a moment long (a client whose connect failed asks who holds the
      // port; so does --stop), no server. Refused as "already running
      // (process id ?)" before.
      const bool readers = flock(fd, LOCK_SH | LOCK_NB) == 0;
      if ((readers || ProcessEnding(ReadLockOwner(fd).pid)) &&
          std::chrono::steady_clock::now() < wait_until) {
        close(fd);  // our shared lock too
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (readers) {
        close(fd);
        return Status::Unavailable(
            fmt::format("cannot take {}: other processes of this user kept reading it "
                        "(clients or shmcache commands asking which server holds port "
                        "{}) for {} s; try again",
                        lock_path, port, kEndingHolderWait.count()));
      }
      Status taken = busy(fd);
      close(fd);
      return taken;
    }
    struct stat now {};
    if (lstat(lock_path.c_str(), &now) != 0 || !SameFile(now, held)) {
      close(fd);  // unlinked by the server that held it: take the new file
      ++replaced;
      continue;
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text.data(), text.size(), 0) < 0) {
      // The lock is what matters; the text is only for messages.
    }
    *fd_out = fd;
    return Status::OK();
  }
  return Status::Unavailable("cannot take " + lock_path +
                             ": it keeps being replaced; try again");
}

}  // namespace

Status TakeInstanceLock(const std::string& lock_path, int port, int* fd_out) {
  return LockFileAtPath(
      lock_path, port, OwnerLine(),
      [port](int held) {
        const int pid = PidStillNamed(ReadLockOwner(held));
        return Status::AlreadyExists(fmt::format(
            "a cache server is already running on port {} (process id {}); stop it "
            "with 'shmcache --stop -p {}' or use another port",
            port, pid > 0 ? std::to_string(pid) : "?", port));
      },
      fd_out);
}

Status TakeHostLock(const std::string& lock_path, int port, const std::string& run_dir,
                    int* fd_out) {
  return LockFileAtPath(
      lock_path, port, fmt::format("{}{}\n", OwnerLine(), run_dir),
      [port](int held) {
        const int pid = PidStillNamed(ReadLockOwner(held));
        const std::string read = ReadLockLine(held, kRunDirLine);
        const char* dir = read.empty() ? "?" : read.c_str();
        return Status::AlreadyExists(fmt::format(
            "a cache server of this user is already running on port {} (process id "
            "{}, run dir {}); stop it with 'SHMCACHE_RUN_DIR={} shmcache --stop -p {}' "
            "or use another port",
            port, pid > 0 ? std::to_string(pid) : "?", dir, ShellQuote(dir), port));
      },
      fd_out);
}

Status InstanceLocks::Take(const std::string& lock_path,
                           const std::string& host_lock_path, int port,
                           const std::string& run_dir,
                           std::unique_ptr<InstanceLocks>* out) {
  int fd = -1;
  Status s = TakeInstanceLock(lock_path, port, &fd);
  if (!s.ok()) return s;
  // The shm files carry only the user and the port: a second server of
  // them with another run dir would adopt, then delete, this one's.
  int host_fd = -1;
  s = TakeHostLock(host_lock_path, port, run_dir, &host_fd);
  if (!s.ok()) {
    // Refused: its lock file is not left in the run dir (held, so removed
    // only if still the one at the path).
    ReleaseLockFile(lock_path, fd);
    close(fd);
    return s;
  }
  out->reset(new InstanceLocks(lock_path, host_lock_path, fd, host_fd, run_dir));
  return Status::OK();
}

void InstanceLocks::NoteShmDir(const std::string& shm_dir) {
  shm_dir_ = shm_dir;
  // Written over the text TakeHostLock wrote, which it begins with: a probe
  // reads the old text or the new, never a truncated one.
  const std::string text = fmt::format("{}{}\n{}\n", OwnerLine(), run_dir_, shm_dir);
  if (pwrite(host_fd_, text.data(), text.size(), 0) < 0) {
    // Only for --stop's count of what a killed server left: without it,
    // nothing is counted while this server runs.
  }
}

void InstanceLocks::NoteServing() {
  // Over NoteShmDir's text, which it begins with, as that one.
  const std::string text =
      fmt::format("{}{}\n{}\n{}\n", OwnerLine(), run_dir_, shm_dir_, kServing);
  if (pwrite(host_fd_, text.data(), text.size(), 0) < 0) {
    // Only for a client's words: without it, a server whose socket is gone
    // is said to be starting still.
  }
}

InstanceLocks::~InstanceLocks() {
  close(host_fd_);
  close(fd_);
}

void InstanceLocks::RemoveFiles() {
  ReleaseLockFile(lock_path_, fd_);
  ReleaseLockFile(host_lock_path_, host_fd_);
}

void ReleaseLockFile(const std::string& lock_path, int fd) {
  struct stat held {
  }, now{};
  if (fd >= 0 && fstat(fd, &held) == 0 && lstat(lock_path.c_str(), &now) == 0 &&
      SameFile(held, now)) {
    unlink(lock_path.c_str());
  }
}

namespace {

// ProbeInstanceLock, and the holder's run dir and shm dir when `host` is
// not null. A file that is not a regular file of this user is no lock of
// its servers (the host lock's dir is open to all): never held. Opened
// without blocking: a FIFO planted there would hold the open for good.
Status ProbeLock(const std::string& lock_path, bool* held, ProcessIdentity* owner,
                 HostLockHolder* host) {
  *held = false;
  *owner = ProcessIdentity{};
  const int fd = open(lock_path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  if (fd < 0) {
    const int err = errno;
    // A link (ELOOP), a socket (ENXIO), another user's file (EACCES): what
    // is there, not why the open failed, says whether it can be a lock.
    if (err == ENOENT || (lstat(lock_path.c_str(), &st) == 0 &&
                          (!S_ISREG(st.st_mode) || st.st_uid != geteuid()))) {
      return Status::OK();
    }
    return Status::FromErrno("cannot open " + lock_path, err);
  }
  // A shared lock is granted only while no server holds the exclusive one;
  // closing the file drops it again.
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      flock(fd, LOCK_SH | LOCK_NB) != 0) {
    *held = true;
    *owner = ReadLockOwner(fd);
    if (host != nullptr) {
      host->run_dir = ReadLockLine(fd, kRunDirLine);
      host->shm_dir = ReadLockLine(fd, kShmDirLine);
      host->serving = ReadLockLine(fd, kServingLine) == kServing;
    }
  }
  close(fd);
  return Status::OK();
}

}  // namespace

Status ProbeInstanceLock(const std::string& lock_path, bool* held,
                         ProcessIdentity* owner) {
  return ProbeLock(lock_path, held, owner, nullptr);
}

Status ProbeHostLock(const std::string& lock_path, HostLockHolder* out) {
  *out = HostLockHolder{};
  return ProbeLock(lock_path, &out->held, &out->owner, out);
}

}  // namespace shmcache
