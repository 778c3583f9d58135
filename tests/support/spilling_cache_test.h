// SpillingCacheTest: the fixture of the spill suites (spill_test.cc,
// spill_stage_test.cc), which begin alike: a spill dir of the test's own, a
// daemon spilling into it, a session and a spilling cache of 1 MB
// (OpenCache's "capacity", capacity_helpers.h), all made before the test.
// After it, in this order: the cache closes, the daemon stops (TestServer
// checks that it left nothing behind), the spill dir is removed. A test
// that needs another start (a full tmpfs, a larger budget, no spill dir)
// makes its own and is a TEST of another suite.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "shmcache/client.h"
#include "tests/support/capacity_helpers.h"
#include "tests/support/files.h"
#include "tests/support/test_server.h"

namespace shmcache::test {

class SpillingCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.ok()) << server_.start_result().Describe();
    ASSERT_NE(session_, 0u);
    ASSERT_TRUE(cache_);
  }

 private:
  // A directory removed when the fixture goes: declared first, so after
  // the daemon that spills into it has stopped.
  struct OwnedDir {
    explicit OwnedDir(std::string p) : path(std::move(p)) {}
    ~OwnedDir() { RemoveTree(path); }
    OwnedDir(const OwnedDir&) = delete;
    OwnedDir& operator=(const OwnedDir&) = delete;
    const std::string path;
  };
  OwnedDir dir_{MakeTempDir(TestTmpRoot(), "spill")};

 protected:
  const std::string spill_ = dir_.path;
  TestServer server_{WithArgs({"-s", spill_})};
  const uint32_t session_ = server_.ok() ? server_.NewSession() : 0;
  std::unique_ptr<Cache> cache_ =
      session_ != 0 ? OpenCache(server_, session_, 1, true) : nullptr;
};

}  // namespace shmcache::test
