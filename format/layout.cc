#include "format/layout.h"

#include <cstring>

namespace shmcache::layout {

const char* CheckFileHeader(const void* base, size_t mapped_bytes, uint64_t magic,
                            size_t header_size) {
  if (mapped_bytes < sizeof(FileHeader) || mapped_bytes < header_size) {
    return "file smaller than its header";
  }
  FileHeader h;
  std::memcpy(&h, base, sizeof h);
  if (h.magic != magic) return "wrong magic number (not a shmcache file)";
  if (h.version != kLayoutVersion) return "layout version differs";
  if (h.header_size != header_size) return "header size differs";
  if (h.file_size != mapped_bytes) return "file size differs from header";
  return nullptr;
}

const char* CheckTableFile(const void* base, size_t mapped_bytes, uint64_t cap,
                           uint32_t gen) {
  if (const char* bad =
          CheckFileHeader(base, mapped_bytes, kTableMagic, sizeof(TableHeader))) {
    return bad;
  }
  const auto* t = static_cast<const TableHeader*>(base);
  if (t->capacity != cap || cap == 0 || (cap & (cap - 1)) != 0 || cap >= (1ULL << 40) ||
      t->capacity_log2 >= 40 || (1ULL << t->capacity_log2) != cap ||
      t->generation != gen || mapped_bytes != TableFileSize(cap)) {
    return "table geometry does not match its cache's header";
  }
  return nullptr;
}

const char* CheckSegmentFile(const void* base, size_t mapped_bytes, uint32_t cache_id,
                             uint32_t seg_no) {
  if (const char* bad =
          CheckFileHeader(base, mapped_bytes, kSegmentMagic, sizeof(SegmentHeader))) {
    return bad;
  }
  const auto* h = static_cast<const SegmentHeader*>(base);
  if (h->seg_id != seg_no || h->cache_id != cache_id ||
      mapped_bytes <= kSegmentHeaderSize) {
    return "segment header does not match (another cache or segment)";
  }
  return nullptr;
}

}  // namespace shmcache::layout
