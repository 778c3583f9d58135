// shmcache/version.h states the version meson.build's project() declares.
#include "shmcache/version.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

TEST(VersionTest, MatchesTheMesonProjectVersion) {
  const char* meson = std::getenv("SHMCACHE_PROJECT_VERSION");
  ASSERT_NE(meson, nullptr) << "run through meson test";
  EXPECT_EQ(VersionText(), meson);
}

}  // namespace
}  // namespace shmcache
