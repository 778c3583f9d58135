// Sessions (store_sessions.cc): a session outlives the client runs that use
// it, and destroying it frees its files and memory while leaving other
// sessions alone. A real daemon per test (integration_fixture.h).
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/child_process.h"
#include "tests/support/integration_fixture.h"
#include "tests/support/row_pattern.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {
namespace {

TEST_F(IntegrationTest, SessionsPersistBetweenClientRuns) {
  {
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    Attach(&client, &cache);
    for (uint64_t id = 0; id < 500; ++id) {
      ASSERT_TRUE(PutPattern(*cache, id, 0, kRowBytes).ok());
    }
  }  // disconnects
  // Another run, in another process.
  pid_t kid = ForkChild([&]() -> int {
    std::unique_ptr<Client> client;
    if (!server_->Connect(&client).ok()) return 2;
    if (!client->CheckSession(session_).ok()) return 3;
    std::unique_ptr<Cache> cache;
    if (!client->OpenCache(Options(session_), &cache).ok()) return 4;
    Row row;
    for (uint64_t id = 0; id < 500; ++id) {
      if (!cache->Get(id, &row).ok() || !RowMatches(row, id, 0, kRowBytes)) return 5;
    }
    for (uint64_t id = 500; id < 600; ++id) {
      if (!PutPattern(*cache, id, 0, kRowBytes).ok()) return 6;
    }
    return 0;
  });
  ASSERT_EQ(WaitChild(kid), 0);
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  Row row;
  for (uint64_t id = 0; id < 600; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
    ASSERT_TRUE(RowMatches(row, id, 0, kRowBytes));
  }
  std::vector<SessionInfo> sessions;
  ASSERT_TRUE(client->ListSessions(&sessions).ok());
  ASSERT_EQ(sessions.size(), 1u);
  ASSERT_EQ(sessions[0].caches.size(), 1u);
  EXPECT_EQ(sessions[0].caches[0].mem_rows, 600u);
}

TEST_F(IntegrationTest, DestroyFreesTheMemory) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  uint32_t keep = 0;
  ASSERT_TRUE(client->CreateSession(&keep).ok());
  std::unique_ptr<Cache> kept = Open(*client, Options(keep, "kept"));
  ASSERT_TRUE(kept);
  ASSERT_TRUE(PutPattern(*kept, 1, 0, kRowBytes).ok());
  for (uint64_t id = 0; id < 3000; ++id) {
    ASSERT_TRUE(PutPattern(*cache, id, 0, kRowBytes).ok());
  }
  RowView view;
  ASSERT_TRUE(cache->View(5, &view).ok());
  auto files_of = [&](uint32_t cache_id) {
    std::vector<std::string> out;
    for (const std::string& f : server_->ShmFiles()) {
      std::string rest = f.substr(server_->shm_prefix().size());
      for (const char* kind : {"cache.", "table.", "seg."}) {
        std::string p = std::string(kind) + std::to_string(cache_id);
        if (rest == p || rest.rfind(p + ".", 0) == 0) out.push_back(f);
      }
    }
    return out;
  };
  EXPECT_GE(files_of(cache->cache_id()).size(), 3u);  // header, table, segments
  ServerInfo before, after;
  ASSERT_TRUE(client->GetServerInfo(&before).ok());

  ASSERT_TRUE(client->DestroySession(session_).ok());
  EXPECT_TRUE(files_of(cache->cache_id()).empty())
      << testing::PrintToString(files_of(cache->cache_id()));
  ASSERT_TRUE(client->GetServerInfo(&after).ok());
  // This process still maps the cache: tmpfs keeps those pages, and the cap
  // counts them (held) until the Cache is closed.
  EXPECT_GT(after.memory_held_bytes, 4u << 20);
  EXPECT_LE(after.memory_used_bytes, before.memory_used_bytes);
  EXPECT_EQ(after.sessions, std::vector<uint32_t>{keep});
  // The open cache says so instead of crashing; a view taken before stays
  // readable (the mapping lives until the Cache is closed).
  Row row;
  EXPECT_TRUE(cache->Get(5, &row).IsNotFound());
  EXPECT_TRUE(PutPattern(*cache, 9999, 0, 10).IsNotFound());
  EXPECT_EQ(std::memcmp(view.column(0).data, Pattern(5, 0, kRowBytes).data(), kRowBytes),
            0);
  EXPECT_TRUE(client->CheckSession(session_).IsNotFound());
  EXPECT_TRUE(client->DestroySession(session_).IsNotFound());
  // Other sessions are untouched.
  ASSERT_TRUE(kept->Get(1, &row).ok());
  EXPECT_TRUE(RowMatches(row, 1, 0, kRowBytes));
  EXPECT_FALSE(files_of(kept->cache_id()).empty());
  cache.reset();  // unmaps: the memory is really free now
  EXPECT_TRUE(WaitFor([&] {
    return client->GetServerInfo(&after).ok() && after.memory_held_bytes == 0;
  }));
  EXPECT_LT(after.memory_used_bytes + 4 * (1 << 20), before.memory_used_bytes);
}

}  // namespace
}  // namespace shmcache::test
