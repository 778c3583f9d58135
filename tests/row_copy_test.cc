// CopyRowBytes and StreamCopy (format/row_copy.h): every byte copied, for
// sizes on both sides of the streaming threshold and of each 64-byte step,
// destinations and sources at every offset within 16 bytes, and nothing
// written outside the destination.
#include "format/row_copy.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(seed >> 24);
  }
  return v;
}

// Copies n bytes from src + so to a zero-filled buffer at dst + do with
// `copy`, and checks the copy and the guard bytes around it.
template <typename Copy>
void CheckCopy(Copy copy, size_t n, size_t so, size_t doff) {
  constexpr size_t kGuard = 64;
  const std::vector<uint8_t> src = Bytes(n + so, static_cast<uint32_t>(n * 31 + so));
  std::vector<uint8_t> dst(n + doff + 2 * kGuard, 0xEE);
  copy(dst.data() + kGuard + doff, src.data() + so, n);
  for (size_t i = 0; i < kGuard + doff; ++i) ASSERT_EQ(dst[i], 0xEE) << "before, " << i;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(dst[kGuard + doff + i], src[so + i]) << "byte " << i << " of " << n;
  }
  for (size_t i = kGuard + doff + n; i < dst.size(); ++i) {
    ASSERT_EQ(dst[i], 0xEE) << "after, " << i;
  }
}

TEST(RowCopyTest, StreamCopyCopiesEveryByteAtEveryAlignment) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{63},
                   size_t{64}, size_t{65}, size_t{127}, size_t{1000}, size_t{4096 + 7}}) {
    for (size_t so = 0; so < 16; so += 3) {
      for (size_t doff = 0; doff < 16; ++doff) {
        ASSERT_NO_FATAL_FAILURE(CheckCopy(StreamCopy, n, so, doff))
            << n << " " << so << " " << doff;
      }
    }
  }
}

TEST(RowCopyTest, RowsAroundTheThresholdCopyWhole) {
  for (size_t n : {kStreamCopyBytes - 8, kStreamCopyBytes, kStreamCopyBytes + 8,
                   size_t{150} * 1024, size_t{600} * 1024 + 24, size_t{1} << 20}) {
    for (size_t doff : {size_t{0}, size_t{8}, size_t{13}}) {
      // One row in the call (memcpy) and a call of 4096 rows (streamed
      // from kStreamCopyBytes on, whatever the machine's cache share).
      for (size_t rows : {size_t{1}, size_t{4096}}) {
        auto copy = [rows](void* d, const void* s, size_t k) {
          CopyRowBytes(d, s, k, rows);
        };
        ASSERT_NO_FATAL_FAILURE(CheckCopy(copy, n, 8, doff))
            << n << " " << doff << " " << rows;
      }
    }
  }
}

}  // namespace
}  // namespace shmcache
