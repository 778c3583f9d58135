// What a test learns from its environment: the built programs under test
// and the length of its stress phases.
#pragma once

#include <string>

namespace shmcache::test {

// Paths of the programs under test: $SHMCACHE_ADMIN / $SHMCACHE_DAEMON_BIN
// (meson sets them for every test), else the ones this build made.
std::string AdminPath();
std::string DaemonPath();

// Seconds a bounded stress phase runs: $name if it starts with a positive
// number, else `fallback`.
double EnvSeconds(const char* name, double fallback);

}  // namespace shmcache::test
