// ShmFile: a file in the shm directory (tmpfs), mapped shared.
//
// Create() reserves the whole size up front (posix_fallocate), so a full
// /dev/shm is reported here, with the numbers, and never becomes a SIGBUS
// when a page is first touched. Files are created 0600.
//
// Ownership: a ShmFile owns its mapping (munmap on destruction) and nothing
// else; the file stays until Unlink().
// Thread safety: none; callers serialise.
#pragma once

#include <cstddef>
#include <string>

#include "shmcache/status.h"

namespace shmcache {

class ShmFile {
 public:
  ShmFile() = default;
  ~ShmFile() { Unmap(); }
  ShmFile(ShmFile&& o) noexcept;
  ShmFile& operator=(ShmFile&& o) noexcept;
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;

  // Creates `path` exclusively with `size` bytes reserved and zeroed. When
  // node >= 0 the pages are bound to that NUMA node (before reservation,
  // so they are allocated there). AlreadyExists if the file exists; Full
  // with a message naming the shortfall and the fix when there is no room.
  static Status Create(const std::string& path, size_t size, int node,
                       ShmFile* out);
  // Maps an existing file read-write.
  static Status Open(const std::string& path, ShmFile* out);
  static Status Unlink(const std::string& path);

  char* data() const { return base_; }
  size_t size() const { return size_; }
  bool mapped() const { return base_ != nullptr; }
  void Unmap();

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
};

// Faults in [p, p+size) of a shared mapping for writing, in one pass in the
// kernel instead of a page fault per 4 KB page later. Best effort.
void PopulateForWrite(void* p, size_t size);

// Free bytes in the filesystem holding `dir`, or 0 on error.
size_t FreeBytes(const std::string& dir);

}  // namespace shmcache
