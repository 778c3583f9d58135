// ShmFile: a file in the shm directory (tmpfs), mapped shared.
//
// Create() sizes the file and reserves (posix_fallocate) the pages of its
// first `supply` bytes, the whole file unless told otherwise; Supply()
// reserves a further range later. Only reserved pages are ever handed out,
// so a full /dev/shm is reported by the call that reserves, with the
// numbers, and never becomes a SIGBUS when a page is first touched. The
// rest of a file is a hole until then: nobody reads or writes it. Files are
// created 0600.
//
// The shm dir is shared with every user of the host (/dev/shm is
// world-writable), so a name of ours may hold a file someone else put
// there. Every open of an existing file goes through OpenOwnedFile, which
// refuses anything but a regular file of this uid, mode 0600, with one
// link; creation never opens an existing file.
//
// Pages are cleared by whoever reserves them (Clearing::kAll) unless the
// file's pages will be written through a descriptor (Clearing::kHugeOnly,
// segments: see WritesThroughFd).
//
// Ownership: a ShmFile owns its mapping (munmap on destruction) and nothing
// else; the file stays until Unlink().
// Thread safety: none; callers serialise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "shmcache/status.h"

namespace shmcache {

// Who clears a file's reserved pages. kAll: the reserving call, in large
// writes of zeros (tmpfs's fallocate leaves each page to be cleared at its
// first fault, one page per fault, in whichever process touches it first).
// kHugeOnly: the reserving call only where WritesThroughFd is false (huge
// pages, or not tmpfs); a segment of 4 KB pages is left uncleared for
// writers that write its rows through a descriptor, whose whole-page
// writes need no clearing (ChunkWriter). A page nobody wrote still reads
// as zero: the kernel clears it at its first fault or partial write.
enum class Clearing { kAll, kHugeOnly };

// Whether fresh pages of the file open at `fd` are better written through
// the descriptor (pwritev) than through a mapping: a tmpfs file of 4 KB
// pages. Not with huge pages (st_blksize 2 MB: a 2 MB page's first fault
// costs one clearing, and a partial write clears all of it just the same).
bool WritesThroughFd(int fd);

class ShmFile {
 public:
  ShmFile() = default;
  ~ShmFile() { Unmap(); }
  ShmFile(ShmFile&& o) noexcept;
  ShmFile& operator=(ShmFile&& o) noexcept;
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;

  // Creates `path` exclusively (never following a symbolic link), mode
  // 0600 whatever the umask, of `size` bytes, the first `supply` of them
  // (all when supply >= size) reserved and zeroed (on
  // tmpfs the pages are cleared here, by the creator, rather than at their
  // first fault in whichever process touches them first). When
  // node >= 0 the pages are bound to that NUMA node (before reservation,
  // so they are allocated there). AlreadyExists if the name is taken, with
  // the file's owner and mode and the fix; Full with a message naming the
  // shortfall and the fix when there is no room.
  // `clearing`: which files' pages are cleared here (Clearing).
  static Status Create(const std::string& path, size_t size, int node, ShmFile* out,
                       size_t supply = SIZE_MAX, Clearing clearing = Clearing::kAll);
  // Reserves and zeroes the pages of [from, to) of an existing file of ours
  // (opened through OpenOwnedFile), as Create does for its first bytes.
  // The pages go to the NUMA node Create bound the file to (a tmpfs file's
  // shared policy lasts as long as the file). REQUIRES: nothing lives in
  // [from, to) yet: it is cleared. Full with Create's message when there
  // is no room; then nothing of the range is kept.
  static Status Supply(const std::string& path, size_t from, size_t to,
                       Clearing clearing = Clearing::kAll);
  // Like Create, under the first name of name(0) .. name(tries - 1) that is
  // free: a taken name (another user may have put a file there) is skipped,
  // never opened. *chosen: the index of the name used (or that failed
  // otherwise), `tries` when every name was taken (AlreadyExists, naming
  // the last one). *skipped (when given): the AlreadyExists message of the
  // first name skipped, "" when none was.
  static Status CreateFresh(const std::function<std::string(uint32_t)>& name,
                            uint32_t tries, size_t size, int node, ShmFile* out,
                            uint32_t* chosen, std::string* skipped = nullptr,
                            size_t supply = SIZE_MAX, Clearing clearing = Clearing::kAll);
  // Maps an existing file read-write, through OpenOwnedFile. With
  // read_only, the same file is also mapped a second time PROT_READ into
  // *read_only: pointers handed to readers come from there, so a stray
  // write through one faults instead of changing what other processes read.
  // With fd, the read-write descriptor stays open (O_CLOEXEC) for the
  // caller, who closes it, when WritesThroughFd holds for it; *fd is -1
  // otherwise.
  static Status Open(const std::string& path, ShmFile* out, ShmFile* read_only = nullptr,
                     int* fd = nullptr);
  static Status Unlink(const std::string& path);

  char* data() const { return base_; }
  size_t size() const { return size_; }
  bool mapped() const { return base_ != nullptr; }
  void Unmap();

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
};

// Opens an existing file of ours: `flags` (O_RDONLY or O_RDWR) plus
// O_NOFOLLOW | O_CLOEXEC, then checks on the descriptor that it is a
// regular file owned by this process's effective uid, mode 0600, with no
// other link. NotFound when it does not exist; PermissionDenied naming the
// file and what is wrong ("... has mode 0666 (not 0600): not ours,
// refusing to map it") otherwise. On success the caller owns *fd, and
// *size (when given) is the file's size.
Status OpenOwnedFile(const std::string& path, int flags, int* fd, size_t* size = nullptr);

// Maps [p, p+size) of a shared mapping of a file made by Create, so that
// writing it takes (almost) no page fault: 16 pages per fault where Create
// zeroed them, instead of a fault per 4 KB page at first write (a page left
// uncleared is cleared by its read fault, one page per fault).
// REQUIRES: the pages are allocated (Create reserved them): it reads them,
// which on a hole of a full tmpfs would be a SIGBUS.
void PopulateForWrite(void* p, size_t size);

// Maps [p, p+size) of a shared mapping writable in one call, clearing
// pages that were left uncleared (Clearing::kHugeOnly): MADV_POPULATE_WRITE
// on the whole pages inside the range. PopulateForWrite's read faults would
// clear such pages one per fault. Best effort: a kernel without it (before
// 5.14) leaves the pages to their first write fault. REQUIRES: as for
// PopulateForWrite.
void PopulateUnclearedForWrite(void* p, size_t size);

// Free bytes in the filesystem holding `dir`, or 0 on error.
size_t FreeBytes(const std::string& dir);

}  // namespace shmcache
