#include "format/cache_name.h"

#include <cstdint>

#include "format/layout.h"

namespace shmcache {

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07, min = 0x10000;
    } else {
      return false;  // a continuation byte, or 0xF8..0xFF
    }
    if (s.size() - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

Status CheckCacheName(std::string_view name, std::string_view fingerprint) {
  if (name.empty() || name.size() > kMaxNameBytes || fingerprint.size() > kMaxNameBytes) {
    return Status::InvalidArgument(
        "a cache name must have 1..255 bytes and a fingerprint at most 255");
  }
  if (!IsValidUtf8(name) || !IsValidUtf8(fingerprint)) {
    return Status::InvalidArgument(
        "a cache name and fingerprint must be valid UTF-8 text");
  }
  return Status::OK();
}

}  // namespace shmcache
