// Row building blocks: element types and the non-owning column description
// a writer hands to Cache::Put.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "shmcache/export.h"

namespace shmcache {

// Element type of a column. The numeric values are stored in shared memory
// and on the wire: never renumber.
enum class DType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kUInt16 = 2,
  kInt16 = 3,
  kUInt32 = 4,
  kInt32 = 5,
  kUInt64 = 6,
  kInt64 = 7,
  kFloat16 = 8,
  kBFloat16 = 9,
  kFloat32 = 10,
  kFloat64 = 11,
  kBool = 12,
  kBytes = 13,       // opaque bytes; shape is {nbytes}
  kComplex64 = 14,   // two float32: real, imaginary
  kComplex128 = 15,  // two float64
};
inline constexpr int kNumDTypes = 16;

// Bytes per element, or 0 for an unknown type value.
inline size_t DTypeSize(DType t) {
  constexpr uint8_t kSizes[kNumDTypes] = {1, 1, 2, 2, 4, 4, 8, 8,
                                          2, 2, 4, 8, 1, 1, 8, 16};
  auto i = static_cast<size_t>(t);
  return i < static_cast<size_t>(kNumDTypes) ? kSizes[i] : 0;
}
// "uint8", "float32", ... ; "invalid" for an unknown value.
SHMCACHE_EXPORT const char* DTypeName(DType t);
// Inverse of DTypeName; false (and *out unchanged) if the name is unknown.
SHMCACHE_EXPORT bool DTypeFromName(std::string_view name, DType* out);

// Limits of a row: columns per row, bytes of a column name (and of a cache
// name or fingerprint).
inline constexpr size_t kMaxColumnsPerRow = 1024;
inline constexpr size_t kMaxNameBytes = 255;

// One column of a row to be written. Nothing is owned: the pointers must
// stay valid for the duration of the Put call only.
// REQUIRES: nbytes == DTypeSize(dtype) * product(shape); name <= 255 bytes;
// shape.size() <= 255.
struct ColumnRef {
  std::string_view name;
  DType dtype = DType::kUInt8;
  std::span<const int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

}  // namespace shmcache
