#include "shm_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <fmt/format.h>
#include <utility>

#include "numa_topology.h"

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
#ifdef MADV_POPULATE_WRITE
  // Linux >= 5.14; elsewhere pages are faulted in on first write as usual.
  (void)madvise(p, size, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)size;
#endif
}

static std::string DirOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

Status ShmFile::Create(const std::string& path, size_t size, int node,
                       ShmFile* out) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return Status::AlreadyExists(path + " exists");
    return Status::FromErrno("cannot create " + path, errno);
  }
  auto fail = [&](Status s) {
    close(fd);
    unlink(path.c_str());
    return s;
  };
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return fail(Status::FromErrno("cannot size " + path, errno));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail(Status::FromErrno("cannot map " + path, errno));
  // tmpfs allocates a file's pages by the file's shared policy, which mbind
  // on a shared mapping sets: bind first, then reserve.
  if (node >= 0) NumaTopology::Get().BindMemory(p, size, node);
  AdviseHugePages(p, size);
  int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err != 0) {
    munmap(p, size);
    if (err == ENOSPC) {
      size_t free_bytes = FreeBytes(DirOf(path));
      return fail(Status::Full(fmt::format(
          "no room in {} for {} MB of shared memory ({} MB free); free some "
          "space, give the container more (docker run --shm-size), or start "
          "the server with a larger or another --shm_dir",
          DirOf(path), (size + (1 << 20) - 1) >> 20, free_bytes >> 20)));
    }
    return fail(Status::FromErrno("cannot reserve " + path, err));
  }
  close(fd);
  out->Unmap();
  out->base_ = static_cast<char*>(p);
  out->size_ = size;
  return Status::OK();
}

Status ShmFile::Open(const std::string& path, ShmFile* out) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + " does not exist");
    if (errno == EACCES || errno == EPERM) {
      return Status::PermissionDenied("permission denied opening " + path);
    }
    return Status::FromErrno("cannot open " + path, errno);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return Status::FromErrno("cannot stat " + path, e);
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    close(fd);
    return Status::Corruption(path + " is empty");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) return Status::FromErrno("cannot map " + path, e);
  AdviseHugePages(p, size);
  out->Unmap();
  out->base_ = static_cast<char*>(p);
  out->size_ = size;
  return Status::OK();
}

Status ShmFile::Unlink(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno("cannot remove " + path, errno);
  }
  return Status::OK();
}

}  // namespace shmcache
