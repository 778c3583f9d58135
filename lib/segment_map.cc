#include "lib/segment_map.h"

#include <unistd.h>

namespace shmcache {

SegmentMap::SegmentMap() : blocks_(new std::atomic<Block*>[kBlocks]) {
  for (uint32_t i = 0; i < kBlocks; ++i) blocks_[i].store(nullptr);
}

SegmentMap::~SegmentMap() {
  for (uint32_t i = 0; i < kBlocks; ++i) delete blocks_[i].load();
  for (int fd : fds_) close(fd);
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
  e.seg = MappedSegment{file.data(), read_only.data(), file.size(), node, fd};
  files_.push_back(std::move(file));
  files_.push_back(std::move(read_only));
  if (fd >= 0) fds_.push_back(fd);
  e.ready.store(true, std::memory_order_release);
  return &e.seg;
}

}  // namespace shmcache
