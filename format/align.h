// Rounding sizes and offsets up to a unit: pages (4 KB, 2 MB), cache lines,
// whole MB. Header-only: the daemon's segment sizing, adoption and spill
// stages use it, and the library's layout constants are its units.
#pragma once

#include <cstdint>

namespace shmcache {

// The smallest multiple of `unit` that is >= n. `unit` > 0 (not only powers
// of two); n + unit - 1 must fit in 64 bits, which every size and offset of
// a cache does (they are bounded by the memory cap).
constexpr uint64_t AlignUp(uint64_t n, uint64_t unit) {
  return (n + unit - 1) / unit * unit;
}

static_assert(AlignUp(0, 4096) == 0 && AlignUp(1, 4096) == 4096 &&
              AlignUp(4096, 4096) == 4096);
static_assert(AlignUp(130, 64) == 192 && AlignUp(5, 3) == 6);

}  // namespace shmcache
