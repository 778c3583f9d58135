// IntegrationTest: the fixture of the end-to-end suites (view_test.cc,
// sessions_test.cc, sharing_test.cc, ...): a real daemon per test, started
// and stopped through the admin binary, and one session on it. Clients run
// in the test's process and in forked ones.
//
// Rows are the deterministic patterns of row_pattern.h, so any process can
// check every byte it reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "shmcache/client.h"
#include "tests/support/test_server.h"

namespace shmcache::test {

constexpr size_t kRowBytes = 3072;

CacheOptions Options(uint32_t session, const std::string& name = "train",
                     uint64_t size_mb = 0);

// Row size varies with the id, so rows straddle chunk ends.
size_t RowBytes(uint64_t id);

// Checks a copied row against the pattern; returns false (with a message
// on stderr) on any difference. Usable in children.
bool RowMatches(const Row& row, uint64_t id, uint64_t salt, size_t n, bool quiet = false);

Status PutPattern(Cache& cache, uint64_t id, uint64_t salt, size_t n,
                  bool* inserted = nullptr);

class IntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TestServer>();
    ASSERT_TRUE(server_->ok());
    session_ = server_->NewSession();
    ASSERT_NE(session_, 0u);
  }
  void TearDown() override { server_.reset(); }

  std::unique_ptr<Cache> Open(Client& client, const CacheOptions& o) {
    std::unique_ptr<Cache> cache;
    Status s = client.OpenCache(o, &cache);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return cache;
  }
  // A client and a cache of this test's session, for this process.
  void Attach(std::unique_ptr<Client>* client, std::unique_ptr<Cache>* cache,
              const std::string& name = "train", uint64_t size_mb = 0) {
    Status s = server_->Connect(client);
    ASSERT_TRUE(s.ok()) << s.ToString();
    *cache = Open(**client, Options(session_, name, size_mb));
    ASSERT_TRUE(*cache);
  }

  std::unique_ptr<TestServer> server_;
  uint32_t session_ = 0;
};

}  // namespace shmcache::test
