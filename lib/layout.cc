#include "layout.h"

#include <cstring>

namespace shmcache::layout {

const char* CheckFileHeader(const void* base, size_t mapped_bytes,
                            uint64_t magic, size_t header_size) {
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

}  // namespace shmcache::layout
