// SegmentMap: a process-local table from segment number to its mapping,
// readable without a lock (two atomic loads), filled under a mutex on first
// use. Mappings live until the map is destroyed, so views stay valid.
//
// Thread safety: Find() from any thread; Insert() under the owner's mutex.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "format/shm_file.h"

namespace shmcache {

// A segment mapped twice: `base` read-write, for this process's writes into
// its own chunks, and `read_base` PROT_READ, for every row handed to a
// reader (a write through a view faults; it never reaches other processes).
// `fd`: the file's read-write descriptor where WritesThroughFd (shm_file.h)
// holds for it (a tmpfs of 4 KB pages: the writer writes a batch's rows
// into fresh pages through it), else -1; `fd_dev` and `fd_ino` name that
// file (FdNamesSegment).
struct MappedSegment {
  char* base = nullptr;
  const char* read_base = nullptr;
  size_t size = 0;
  int node = 0;
  int fd = -1;
  dev_t fd_dev = 0;
  ino_t fd_ino = 0;
};

// Whether seg.fd still names the segment's file. Other code of the process
// may close a descriptor it does not own (a loop that closes every fd) and
// open another file under its number: rows written there would be lost to
// readers, and that file overwritten.
bool FdNamesSegment(const MappedSegment& seg);

class SegmentMap {
 public:
  static constexpr uint32_t kBlockBits = 12;
  static constexpr uint32_t kBlocks = 2048;  // 8 M segments

  SegmentMap();
  ~SegmentMap();
  SegmentMap(const SegmentMap&) = delete;
  SegmentMap& operator=(const SegmentMap&) = delete;

  // nullptr when not mapped (yet).
  const MappedSegment* Find(uint32_t seg_no) const {
    uint32_t b = seg_no >> kBlockBits;
    if (b >= kBlocks) return nullptr;
    Block* block = blocks_[b].load(std::memory_order_acquire);
    if (block == nullptr) return nullptr;
    const Entry& e = block->entries[seg_no & ((1u << kBlockBits) - 1)];
    return e.ready.load(std::memory_order_acquire) ? &e.seg : nullptr;
  }
  // Takes ownership of both mappings of the file (read_only: the PROT_READ
  // one, same size) and of `fd` (-1: none; closed here when the segment
  // number is out of range; at the end, only while it still names the
  // file). REQUIRES: owner's mutex held.
  const MappedSegment* Insert(uint32_t seg_no, ShmFile file, ShmFile read_only, int node,
                              int fd = -1);

 private:
  struct Entry {
    MappedSegment seg;
    std::atomic<bool> ready{false};
  };
  struct Block {
    Entry entries[1u << kBlockBits];
  };
  std::unique_ptr<std::atomic<Block*>[]> blocks_;
  std::vector<ShmFile> files_;
  std::vector<const MappedSegment*> with_fd_;
};

}  // namespace shmcache
