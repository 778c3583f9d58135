// CopyRowBytes: how a row's bytes are copied out of shared memory into a
// reader's buffer (Get, GetBatch, a batch's tensors). Rows of
// kStreamCopyBytes or more are written with non-temporal stores: a copy that
// large does not stay in the reader's caches anyway (a batch of them is
// megabytes), and streaming the stores skips reading each destination line
// before it is written, a third of the copy's memory traffic. Measured on
// the project's VM (random rows of a 512 MB shm mapping into 64 reused
// buffers, interleaved, best of 5): 1.15-1.5x memcpy at 150 KB to 1 MB,
// none at 64 KB and below (docs/large-rows.md). Smaller rows take memcpy,
// behind one predictable branch.
// Thread safety: stateless.
#pragma once

#include <cstddef>
#include <cstring>

namespace shmcache {

inline constexpr size_t kStreamCopyBytes = 128u << 10;

// Copies n bytes with non-temporal stores (memcpy where the CPU has none).
// dst and src need no alignment; the regions must not overlap.
void StreamCopy(void* dst, const void* src, size_t n);

inline void CopyRowBytes(void* dst, const void* src, size_t n) {
  if (n >= kStreamCopyBytes) [[unlikely]] {
    StreamCopy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace shmcache
