// Cache::ClaimBuild, Seal and GetSealedRows: the records of a streaming
// cache (one builder over all processes, then a seal with the row count),
// and their compatibility with caches the Python package sealed before
// they existed. Every test runs its own daemon.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "shmcache/cache.h"
#include "shmcache/client.h"
#include "tests/support/test_server.h"

namespace shmcache::test {
namespace {

// The ids the Python package used for the records (torch.py, before Seal).
constexpr uint64_t kOldBuilderId = ~uint64_t{0};
constexpr uint64_t kOldSealedId = ~uint64_t{0} - 1;

std::unique_ptr<Cache> Open(const TestServer& server, uint32_t session) {
  std::unique_ptr<Client> client;
  EXPECT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(CacheNamed(session, "stream", 16, false), &cache);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return cache;
}

// In a forked process: the sealed row count another process sees, or
// 200 + what went wrong.
int SealedRowsInChild(const TestServer& server, uint32_t session) {
  return WaitChild(ForkChild([&]() -> int {
    std::unique_ptr<Cache> cache = Open(server, session);
    uint64_t n = 0;
    if (!cache) return 201;
    Status s = cache->GetSealedRows(&n);
    if (s.IsNotFound()) return 202;
    return s.ok() ? static_cast<int>(n) : 203;
  }));
}

TEST(Seal, UnsealedUntilSealedThenTheFirstSealWins) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  uint32_t session = server.NewSession();
  std::unique_ptr<Cache> cache = Open(server, session);
  ASSERT_TRUE(cache);
  uint64_t n = 99;
  EXPECT_TRUE(cache->GetSealedRows(&n).IsNotFound());
  EXPECT_EQ(n, 99u) << "*num_rows is set only on OK";
  EXPECT_EQ(SealedRowsInChild(server, session), 202);

  ASSERT_TRUE(cache->Seal(100).ok());
  ASSERT_TRUE(cache->GetSealedRows(&n).ok());
  EXPECT_EQ(n, 100u);
  ASSERT_TRUE(cache->Seal(7).ok());
  ASSERT_TRUE(cache->GetSealedRows(&n).ok());
  EXPECT_EQ(n, 100u) << "a second seal changed the first";
  EXPECT_EQ(SealedRowsInChild(server, session), 100);
}

TEST(Seal, OneBuilderOverAllProcesses) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  uint32_t session = server.NewSession();
  constexpr int kClaimers = 4;
  std::vector<pid_t> kids;
  for (int k = 0; k < kClaimers; ++k) {
    kids.push_back(ForkChild([&]() -> int {
      std::unique_ptr<Cache> cache = Open(server, session);
      bool claimed = false;
      if (!cache || !cache->ClaimBuild(&claimed).ok()) return 3;
      return claimed ? 10 : 11;
    }));
  }
  int builders = 0;
  for (pid_t k : kids) {
    int rc = WaitChild(k);
    EXPECT_TRUE(rc == 10 || rc == 11) << "claimer ended with " << rc;
    builders += rc == 10;
  }
  EXPECT_EQ(builders, 1);
  std::unique_ptr<Cache> cache = Open(server, session);
  ASSERT_TRUE(cache);
  bool claimed = true;
  ASSERT_TRUE(cache->ClaimBuild(&claimed).ok());
  EXPECT_FALSE(claimed) << "the build was claimed twice";
}

TEST(Seal, ErrorsLeaveTheClaimUnclaimed) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Cache> cache = Open(server, server.NewSession());
  ASSERT_TRUE(cache);
  cache->Close();
  bool claimed = true;
  EXPECT_FALSE(cache->ClaimBuild(&claimed).ok());
  EXPECT_FALSE(claimed);
  EXPECT_FALSE(cache->Seal(3).ok());
}

// Records written as the Python package wrote them before Seal existed
// read as a claim and a seal, and Seal writes what those readers parse.
TEST(Seal, RecordsAreThoseOfCachesSealedBefore) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  uint32_t session = server.NewSession();
  std::unique_ptr<Cache> cache = Open(server, session);
  ASSERT_TRUE(cache);
  const int64_t pid = getpid(), count = 42;
  const int64_t one[1] = {1};
  ColumnRef builder{"builder", DType::kInt64, one, &pid, 8};
  ColumnRef sealed{"count", DType::kInt64, {}, &count, 8};
  ASSERT_TRUE(cache->Put(kOldBuilderId, std::span(&builder, 1)).ok());
  ASSERT_TRUE(cache->Put(kOldSealedId, std::span(&sealed, 1)).ok());
  bool claimed = true;
  ASSERT_TRUE(cache->ClaimBuild(&claimed).ok());
  EXPECT_FALSE(claimed);
  uint64_t n = 0;
  ASSERT_TRUE(cache->GetSealedRows(&n).ok());
  EXPECT_EQ(n, 42u);

  // The other way: what an old reader finds after Seal.
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> other;
  ASSERT_TRUE(client->OpenCache(CacheNamed(session, "other", 16, false), &other).ok());
  ASSERT_TRUE(other->Seal(5).ok());
  Row row;
  ASSERT_TRUE(other->Get(kOldSealedId, &row).ok());
  ASSERT_EQ(row.num_columns(), 1u);
  ColumnView c = row.column(0);
  EXPECT_EQ(c.name, "count");
  EXPECT_EQ(c.dtype, DType::kInt64);
  EXPECT_TRUE(c.shape.empty());
  int64_t got = 0;
  ASSERT_EQ(c.nbytes, 8u);
  std::memcpy(&got, c.data, 8);
  EXPECT_EQ(got, 5);
}

TEST(Seal, ARowThatIsNoSealRecordIsCorruption) {
  TestServer server;
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Cache> cache = Open(server, server.NewSession());
  ASSERT_TRUE(cache);
  const char text[] = "not a count";
  ASSERT_TRUE(cache->Put(kOldSealedId, text, sizeof text).ok());
  uint64_t n = 7;
  Status s = cache->GetSealedRows(&n);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_EQ(n, 7u);
}

}  // namespace
}  // namespace shmcache::test
