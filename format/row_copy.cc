#include "format/row_copy.h"

#include <cstdint>

#include "format/cache_share.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace shmcache {

void StreamCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Up to the destination's first 16-byte boundary by memcpy; the stores
  // after it must be aligned (SSE2, which every x86-64 CPU has).
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > n) head = n;
  // memcpy's pointers must be valid even for 0 bytes (a null row of 0 bytes).
  if (head > 0) std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t k = 0;
  for (; k + 64 <= n; k += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + k), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + k + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + k + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + k + 48), e);
  }
  if (n > k) std::memcpy(d + k, s + k, n - k);
  // Streaming stores are weakly ordered: fence them before the row is
  // handed to the caller (or to another thread).
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

void CopyLargeRow(void* dst, const void* src, size_t n, size_t rows_in_call) {
  if (StreamsRows(n, rows_in_call, CacheShareBytes())) {
    StreamCopy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace shmcache
