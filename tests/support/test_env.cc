#include "tests/support/test_env.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

namespace shmcache::test {

namespace {

std::string FromEnv(const char* name, const char* built) {
  const char* p = std::getenv(name);
  return p && *p ? p : built;
}

}  // namespace

// SHMCACHE_TEST_ADMIN / SHMCACHE_TEST_DAEMON: set by tests/support/meson.build.
std::string AdminPath() { return FromEnv("SHMCACHE_ADMIN", SHMCACHE_TEST_ADMIN); }
std::string DaemonPath() { return FromEnv("SHMCACHE_DAEMON_BIN", SHMCACHE_TEST_DAEMON); }

double EnvSeconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  double d = 0;
  std::from_chars_result r = std::from_chars(v, v + std::strlen(v), d);
  return r.ec == std::errc{} && d > 0 ? d : fallback;
}

}  // namespace shmcache::test
