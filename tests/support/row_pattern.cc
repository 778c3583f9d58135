#include "tests/support/row_pattern.h"

namespace shmcache::test {

void FillPattern(uint64_t id, uint64_t salt, void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t x = (id + 1) * 0x9E3779B97F4A7C15ULL ^ (salt * 0xD1B54A32D192ED03ULL);
  if (x == 0) x = 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x);
  }
}

std::vector<uint8_t> Pattern(uint64_t id, uint64_t salt, size_t n) {
  std::vector<uint8_t> v(n);
  FillPattern(id, salt, v.data(), n);
  return v;
}

}  // namespace shmcache::test
