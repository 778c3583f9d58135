#include "shmcache/types.h"

#include <cstring>

namespace shmcache {
namespace {
constexpr const char* kNames[kNumDTypes] = {
    "uint8",  "int8",  "uint16",    "int16",      "uint32",  "int32",
    "uint64", "int64", "float16",   "bfloat16",   "float32", "float64",
    "bool",   "bytes", "complex64", "complex128",
};
}  // namespace

const char* DTypeName(DType t) {
  auto i = static_cast<size_t>(t);
  return i < kNumDTypes ? kNames[i] : "invalid";
}

bool DTypeFromName(std::string_view name, DType* out) {
  for (size_t i = 0; i < kNumDTypes; ++i) {
    if (name == kNames[i]) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

}  // namespace shmcache
