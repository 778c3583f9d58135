#include "format/shm_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "format/numa_topology.h"
#include "format/owned_dir.h"

namespace shmcache {

ShmFile::ShmFile(ShmFile&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)) {}

ShmFile& ShmFile::operator=(ShmFile&& o) noexcept {
  if (this != &o) {
    Unmap();
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void ShmFile::Unmap() {
  if (base_ != nullptr) munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
}

size_t FreeBytes(const std::string& dir) {
  struct statvfs v;
  if (statvfs(dir.c_str(), &v) != 0) return 0;
  return static_cast<size_t>(v.f_bavail) * v.f_frsize;
}

// Huge pages cut page faults and TLB misses by 512x where the shm dir
// allows them (a tmpfs mounted huge=within_size, or shmem_enabled=advise);
// elsewhere the advice is refused and nothing changes.
static void AdviseHugePages(void* p, size_t size) {
  if (size >= (2u << 20)) (void)madvise(p, size, MADV_HUGEPAGE);
}

void PopulateForWrite(void* p, size_t size) {
  if (size == 0) return;
  // One read per 64 KB, from here rather than with MADV_POPULATE_*: a read
  // fault on a shared tmpfs mapping maps its page writable already (tmpfs
  // asks for no write notification) together with the already zeroed pages
  // of its 64 KB window (the kernel's fault-around; 64 KB unless an admin
  // changed it), where a write fault maps one page; and MADV_POPULATE_*
  // walks the pages one by one, marking each accessed under an LRU lock.
  // Measured: ~0.25 us per 4 KB page against ~1.1 (write faults or
  // MADV_POPULATE_WRITE) and ~0.5 (MADV_POPULATE_READ). A page left
  // unmapped is write-faulted later, as before.
  static constexpr size_t kFaultAround = 64u << 10;
  const volatile char* b = static_cast<const volatile char*>(p);
  for (size_t off = 0; off < size; off += kFaultAround) (void)b[off];
  (void)b[size - 1];
}

bool WritesThroughFd(int fd) {
  struct statfs fs;
  struct stat st;
  return fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC && fstat(fd, &st) == 0 &&
         static_cast<uint64_t>(st.st_blksize) < (2u << 20);
}

void PopulateUnclearedForWrite(void* p, size_t size) {
  static const auto kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  char* const begin = static_cast<char*>(p);
  const auto addr = reinterpret_cast<uintptr_t>(begin);
  char* const from = begin + (kPage - addr % kPage) % kPage;
  char* const to = begin + size - (addr + size) % kPage;
  if (to > from) {
    (void)madvise(from, static_cast<size_t>(to - from), MADV_POPULATE_WRITE);
  }
}

static std::string DirOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// tmpfs's fallocate allocates pages but leaves each to be cleared at its
// first fault, one page per fault, in whichever process touches it first:
// the trainer. Writing zeros through the descriptor clears them here, in
// large blocks, about 4x cheaper than faulting them. Best effort: on error
// the pages are cleared at their first fault as before. Other file systems
// (a --shm_dir on disk) are left alone: zeros there would be disk writes;
// so are the pages Clearing::kHugeOnly leaves to writers.
static void ZeroPages(int fd, size_t from, size_t to, Clearing clearing) {
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC) return;
  if (clearing == Clearing::kHugeOnly && WritesThroughFd(fd)) return;
  static constexpr size_t kBlock = 1u << 20;
  static const std::vector<char> zeros(kBlock, 0);
  for (size_t off = from; off < to;) {
    ssize_t n =
        pwrite(fd, zeros.data(), std::min(kBlock, to - off), static_cast<off_t>(off));
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reserves [from, to) of fd, and clears it as `clearing` says: Full naming
// the shortfall when the shm filesystem has no room (tmpfs then gives back
// what this call took). The reservation alone keeps a full /dev/shm from
// becoming a SIGBUS: fallocate allocates (and charges) the pages; clearing
// them only moves the cost of their first touch.
static Status ReservePages(int fd, const std::string& path, size_t from, size_t to,
                           Clearing clearing) {
  if (to <= from) return Status::OK();
  int err = posix_fallocate(fd, static_cast<off_t>(from), static_cast<off_t>(to - from));
  if (err == ENOSPC) {
    size_t free_bytes = FreeBytes(DirOf(path));
    return Status::FullNoShmRoom(
        fmt::format("no room in {} for {} MB of shared memory ({} MB free); free some "
                    "space, give the container more (docker run --shm-size), or start "
                    "the server with a larger or another --shm_dir",
                    DirOf(path), (to - from + (1 << 20) - 1) >> 20, free_bytes >> 20));
  }
  if (err != 0) return Status::FromErrno("cannot reserve " + path, err);
  ZeroPages(fd, from, to, clearing);
  return Status::OK();
}

// Why a file is not one this process may map, or "" when it may.
static std::string Unsafe(const struct stat& st) {
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (st.st_uid != geteuid()) return "is owned by " + OwnerName(st.st_uid);
  if ((st.st_mode & 07777) != 0600) {
    return fmt::format("has mode {:04o} (not 0600)", st.st_mode & 07777);
  }
  if (st.st_nlink != 1) return fmt::format("has {} links", st.st_nlink);
  return "";
}

Status OpenOwnedFile(const std::string& path, int flags, int* fd_out, size_t* size) {
  int fd = open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return Status::NotFound(path + " does not exist");
    if (e == ELOOP) {
      return Status::PermissionDenied(
          path + " is a symbolic link: not ours, refusing to map it");
    }
    if (e == EACCES || e == EPERM) {
      return Status::PermissionDenied("permission denied opening " + path);
    }
    return Status::FromErrno("cannot open " + path, e);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return Status::FromErrno("cannot stat " + path, e);
  }
  if (st.st_nlink == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
    // Removed between the open and the fstat (its cache or session was
    // just dropped): gone, as if the open had come a moment later.
    close(fd);
    return Status::NotFound(path + " was removed");
  }
  if (std::string why = Unsafe(st); !why.empty()) {
    close(fd);
    return Status::PermissionDenied(
        fmt::format("{} {}: not ours, refusing to map it", path, why));
  }
  if (size != nullptr) *size = static_cast<size_t>(st.st_size);
  *fd_out = fd;
  return Status::OK();
}

// The AlreadyExists answer for a taken name: whose file it is, and the fix.
static Status Taken(const std::string& path) {
  struct stat st;
  std::string what = "exists";
  if (lstat(path.c_str(), &st) == 0) {
    what = fmt::format("exists ({}owned by {}, mode {:04o})",
                       S_ISLNK(st.st_mode) ? "a symbolic link, " : "",
                       OwnerName(st.st_uid), st.st_mode & 07777);
  }
  return Status::AlreadyExists(
      fmt::format("{} {}; remove it (as its owner or root) or start the server with "
                  "another --shm_dir or port",
                  path, what));
}

Status ShmFile::Create(const std::string& path, size_t size, int node, ShmFile* out,
                       size_t supply, Clearing clearing) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return Taken(path);
    return Status::FromErrno("cannot create " + path, errno);
  }
  auto fail = [&](Status s) {
    close(fd);
    unlink(path.c_str());
    return s;
  };
  // The umask may have taken bits away; clients and a restarted server
  // accept exactly 0600.
  if (fchmod(fd, 0600) != 0) {
    return fail(Status::FromErrno("cannot set the mode of " + path, errno));
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return fail(Status::FromErrno("cannot size " + path, errno));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail(Status::FromErrno("cannot map " + path, errno));
  // tmpfs allocates a file's pages by the file's shared policy, which mbind
  // on a shared mapping sets: bind first, then reserve.
  if (node >= 0) NumaTopology::Get().BindMemory(p, size, node);
  AdviseHugePages(p, size);
  Status reserved = ReservePages(fd, path, 0, std::min(size, supply), clearing);
  if (!reserved.ok()) {
    munmap(p, size);
    return fail(reserved);
  }
  close(fd);
  out->Unmap();
  out->base_ = static_cast<char*>(p);
  out->size_ = size;
  return Status::OK();
}

Status ShmFile::CreateFresh(const std::function<std::string(uint32_t)>& name,
                            uint32_t tries, size_t size, int node, ShmFile* out,
                            uint32_t* chosen, std::string* skipped, size_t supply,
                            Clearing clearing) {
  if (skipped != nullptr) skipped->clear();
  Status s = Status::AlreadyExists("no name to create a file under");
  for (uint32_t i = 0; i < tries; ++i) {
    s = Create(name(i), size, node, out, supply, clearing);
    if (!s.IsAlreadyExists()) {
      *chosen = i;
      return s;
    }
    if (skipped != nullptr && skipped->empty()) *skipped = s.message();
  }
  *chosen = tries;
  return s;
}

Status ShmFile::Supply(const std::string& path, size_t from, size_t to,
                       Clearing clearing) {
  int fd = -1;
  size_t size = 0;
  Status s = OpenOwnedFile(path, O_RDWR, &fd, &size);
  if (!s.ok()) return s;
  if (to > size) {
    close(fd);
    return Status::InvalidArgument(
        fmt::format("{}: pages up to {} asked of a file of {} bytes", path, to, size));
  }
  s = ReservePages(fd, path, from, to, clearing);
  close(fd);
  return s;
}

Status ShmFile::Open(const std::string& path, ShmFile* out, ShmFile* read_only,
                     int* fd_out) {
  if (fd_out != nullptr) *fd_out = -1;
  int fd = -1;
  size_t size = 0;
  Status s = OpenOwnedFile(path, O_RDWR, &fd, &size);
  if (!s.ok()) return s;
  if (size == 0) {
    close(fd);
    return Status::Corruption(path + " is empty");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  void* ro = nullptr;
  if (p != MAP_FAILED && read_only != nullptr) {
    ro = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    e = errno;
    if (ro == MAP_FAILED) munmap(p, size);
  }
  if (fd_out != nullptr && p != MAP_FAILED && ro != MAP_FAILED && WritesThroughFd(fd)) {
    *fd_out = fd;
  } else {
    close(fd);
  }
  if (p == MAP_FAILED || ro == MAP_FAILED) {
    return Status::FromErrno("cannot map " + path, e);
  }
  AdviseHugePages(p, size);
  out->Unmap();
  out->base_ = static_cast<char*>(p);
  out->size_ = size;
  if (read_only != nullptr) {
    AdviseHugePages(ro, size);
    read_only->Unmap();
    read_only->base_ = static_cast<char*>(ro);
    read_only->size_ = size;
  }
  return Status::OK();
}

Status ShmFile::Unlink(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno("cannot remove " + path, errno);
  }
  return Status::OK();
}

}  // namespace shmcache
