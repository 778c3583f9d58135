// The daemon's socket and shared-memory files: owner-only while it runs,
// all gone after a stop. A real daemon per test (integration_fixture.h).
#include <sys/stat.h>
#include <unistd.h>

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

}  // namespace
}  // namespace shmcache::test
