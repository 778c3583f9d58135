// The daemon's socket and shared-memory files: owner-only while it runs,
// all gone after a stop. A real daemon per test (integration_fixture.h).
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/files.h"
#include "tests/support/integration_fixture.h"

namespace shmcache::test {
namespace {

TEST_F(IntegrationTest, StopRemovesTheSocketAndEverySegment) {
  {
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    Attach(&client, &cache);
    for (uint64_t id = 0; id < 2000; ++id) {
      ASSERT_TRUE(PutPattern(*cache, id, 0, kRowBytes).ok());
    }
    std::unique_ptr<Cache> second = Open(*client, Options(session_, "eval"));
    ASSERT_TRUE(PutPattern(*second, 1, 0, kRowBytes).ok());
  }
  EXPECT_GE(server_->ShmFiles().size(), 6u);
  ASSERT_TRUE(PathExists(server_->socket_path()));
  CommandResult r = server_->Stop();
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(server_->ShmFiles().empty()) << testing::PrintToString(server_->ShmFiles());
  EXPECT_FALSE(PathExists(server_->socket_path()));
  EXPECT_TRUE(ListDir(server_->shm_dir()).empty());
}

// Only the owner may reach the daemon or map its memory.
TEST_F(IntegrationTest, SocketAndSharedMemoryAreOwnerOnly) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 1, 0, kRowBytes).ok());
  struct stat st;
  ASSERT_EQ(stat(server_->socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << std::oct << st.st_mode;
  EXPECT_EQ(st.st_uid, geteuid());
  ASSERT_EQ(stat(server_->run_dir().c_str(), &st), 0);
  for (const std::string& f : server_->ShmFiles()) {
    ASSERT_EQ(stat((server_->shm_dir() + "/" + f).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0077, 0u) << f << " mode " << std::oct << st.st_mode;
  }
}

// A server started from a shell whose file size limit (ulimit -f) lies
// below its caches' files died of SIGXFSZ, silently, at the first segment
// it made past the limit (its trainers' puts then found the connection
// closed). It raises its soft limit as it raises its descriptors', so its
// caches' files are made as anywhere else.
TEST(ServerLimitsTest, AServerStartedUnderAFileSizeLimitMakesItsCachesFiles) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  const rlimit low{2u << 20, saved.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  // The admin, and the daemon it starts, inherit the limit.
  auto server = std::make_unique<TestServer>();
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  ASSERT_TRUE(server->ok()) << server->start_result().Describe();
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server->Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s =
      client->OpenCache(CacheNamed(server->NewSession(), "limit", 64, false), &cache);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const uint64_t rows = (8u << 20) / kRowBytes;  // past the limit in its segments
  for (uint64_t id = 0; id < rows; ++id) {
    s = PutPattern(*cache, id, 0, kRowBytes);
    ASSERT_TRUE(s.ok()) << id << ": " << s.ToString();
  }
  EXPECT_EQ(kill(server->pid(), 0), 0) << "the server died";
  Row row;
  ASSERT_TRUE(cache->Get(rows - 1, &row).ok());
  EXPECT_TRUE(RowMatches(row, rows - 1, 0, kRowBytes));
}

}  // namespace
}  // namespace shmcache::test
