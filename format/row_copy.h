// CopyRowBytes: how a row's bytes are copied out of shared memory into a
// reader's buffer (Get, GetBatch, a batch's tensors). A call's rows are
// written with non-temporal stores only when they are large
// (kStreamCopyBytes or more) and the call's destinations together exceed
// this CPU's share of the last-level cache (cache_share.h): then they would
// not stay cached anyway, and streaming the stores skips reading each
// destination line before it is written, a third of the copy's memory
// traffic. Otherwise memcpy: a destination that fits the cache (a Row reused
// call after call, a batch of a few megabytes) is written in the cache, and
// streaming it to memory instead made the copy 0.75x of memcpy at 150 KB on
// the project's VM. Measured there (random rows of a 512 MB shm mapping,
// interleaved, best of 5; docs/large-rows.md): streaming is 1.2-1.4x memcpy
// for 64 destinations of 600 KB or 1 MB (38-64 MB), 0.75-0.8x for one
// destination of any size or 64 of 150 KB (9.6 MB). Smaller rows take
// memcpy behind one predictable branch.
// Thread safety: stateless but for CacheShareBytes's once-read value.
#pragma once

#include <cstddef>
#include <cstring>

namespace shmcache {

// Rows smaller than this never stream: streaming lost to memcpy at 64 KB and
// below even into cold destinations.
inline constexpr size_t kStreamCopyBytes = 128u << 10;

// Copies n bytes with non-temporal stores (memcpy where the CPU has none).
// dst and src need no alignment; the regions must not overlap.
void StreamCopy(void* dst, const void* src, size_t n);

// Whether a call copying `rows` rows of n bytes each, into as many distinct
// destinations, streams them when `share` bytes of cache are this CPU's:
// the rows are large and their destinations together exceed the share.
constexpr bool StreamsRows(size_t n, size_t rows, size_t share) {
  return n >= kStreamCopyBytes && rows > share / n;
}

// CopyRowBytes's large-row half: StreamsRows against CacheShareBytes(),
// then StreamCopy or memcpy. Out of line: it reads the share.
void CopyLargeRow(void* dst, const void* src, size_t n, size_t rows_in_call);

// Copies one row of n bytes of a call that copies `rows_in_call` rows
// (1 for Get; a batch's size for GetBatch and read_into) into distinct
// destinations.
inline void CopyRowBytes(void* dst, const void* src, size_t n, size_t rows_in_call) {
  if (n >= kStreamCopyBytes) [[unlikely]] {
    CopyLargeRow(dst, src, n, rows_in_call);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace shmcache
