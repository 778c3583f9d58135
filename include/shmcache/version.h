// The version of the shmcache library and tools, as meson.build's project
// version states it (tests/version_test.cc checks that the two agree).
// Update both when releasing.
#pragma once

#include <string>

namespace shmcache {

inline constexpr int kMajorVersion = 0;
inline constexpr int kMinorVersion = 1;
inline constexpr int kPatchVersion = 0;

// "MAJOR.MINOR.PATCH", as `shmcache --version` and `shmcached --version`
// print it.
inline std::string VersionText() {
  return std::to_string(kMajorVersion) + "." + std::to_string(kMinorVersion) + "." +
         std::to_string(kPatchVersion);
}

}  // namespace shmcache
