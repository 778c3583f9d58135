#include "lib/segment_map.h"

#include <sys/stat.h>
#include <unistd.h>

namespace shmcache {

SegmentMap::SegmentMap() : blocks_(new std::atomic<Block*>[kBlocks]) {
  for (uint32_t i = 0; i < kBlocks; ++i) blocks_[i].store(nullptr);
}

bool FdNamesSegment(const MappedSegment& seg) {
  struct stat st;
  return seg.fd >= 0 && fstat(seg.fd, &st) == 0 && st.st_dev == seg.fd_dev &&
         st.st_ino == seg.fd_ino;
}

SegmentMap::~SegmentMap() {
  // A number that names another file now is not ours to close.
  for (const MappedSegment* seg : with_fd_) {
    if (FdNamesSegment(*seg)) close(seg->fd);
  }
  for (uint32_t i = 0; i < kBlocks; ++i) delete blocks_[i].load();
}

const MappedSegment* SegmentMap::Insert(uint32_t seg_no, ShmFile file, ShmFile read_only,
                                        int node, int fd) {
  uint32_t b = seg_no >> kBlockBits;
  if (b >= kBlocks) {
    if (fd >= 0) close(fd);
    return nullptr;
  }
  Block* block = blocks_[b].load(std::memory_order_acquire);
  if (block == nullptr) {
    block = new Block();
    blocks_[b].store(block, std::memory_order_release);
  }
  Entry& e = block->entries[seg_no & ((1u << kBlockBits) - 1)];
  if (e.ready.load(std::memory_order_acquire)) {
    if (fd >= 0) close(fd);
    return &e.seg;
  }
  e.seg = MappedSegment{file.data(), read_only.data(), file.size(), node};
  if (struct stat st; fd >= 0 && fstat(fd, &st) == 0) {
    e.seg.fd = fd;
    e.seg.fd_dev = st.st_dev;
    e.seg.fd_ino = st.st_ino;
    with_fd_.push_back(&e.seg);
  } else if (fd >= 0) {
    close(fd);  // written through the mapping instead
  }
  files_.push_back(std::move(file));
  files_.push_back(std::move(read_only));
  e.ready.store(true, std::memory_order_release);
  return &e.seg;
}

}  // namespace shmcache
