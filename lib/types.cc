#include "shmcache/types.h"

#include <cstring>

namespace shmcache {
namespace {
struct TypeInfo {
  const char* name;
  size_t size;
};
constexpr TypeInfo kTypes[kNumDTypes] = {
    {"uint8", 1},   {"int8", 1},     {"uint16", 2},  {"int16", 2},
    {"uint32", 4},  {"int32", 4},    {"uint64", 8},  {"int64", 8},
    {"float16", 2}, {"bfloat16", 2}, {"float32", 4}, {"float64", 8},
    {"bool", 1},    {"bytes", 1},
};
}  // namespace

size_t DTypeSize(DType t) {
  auto i = static_cast<size_t>(t);
  return i < kNumDTypes ? kTypes[i].size : 0;
}

const char* DTypeName(DType t) {
  auto i = static_cast<size_t>(t);
  return i < kNumDTypes ? kTypes[i].name : "invalid";
}

bool DTypeFromName(std::string_view name, DType* out) {
  for (size_t i = 0; i < kNumDTypes; ++i) {
    if (name == kTypes[i].name) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

}  // namespace shmcache
