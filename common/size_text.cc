#include "common/size_text.h"

#include <fmt/format.h>

namespace shmcache {

std::string SizeText(uint64_t n) {
  if (n >= (uint64_t{1} << 20)) {
    return fmt::format("{:.1f} MB", static_cast<double>(n) / (1 << 20));
  }
  if (n >= 1024) return fmt::format("{} KB", (n + 512) / 1024);
  return fmt::format("{} bytes", n);
}

}  // namespace shmcache
