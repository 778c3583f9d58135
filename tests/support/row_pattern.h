// Deterministic row contents: any process can rebuild the bytes of row `id`
// from the id alone and check what it read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shmcache::test {

// A deterministic byte pattern for row `id` (salt tells writers apart).
void FillPattern(uint64_t id, uint64_t salt, void* dst, size_t n);
std::vector<uint8_t> Pattern(uint64_t id, uint64_t salt, size_t n);

}  // namespace shmcache::test
