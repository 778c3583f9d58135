// A daemon stopped (SIGSTOP) while clients wait on it, as a debugger or a
// frozen cgroup stops one: every call that needs it fails within the
// client's request timeout, whatever other threads of the process wait on
// it too, and the clients go on once it runs again.
#include <signal.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/support/checked_rows.h"
#include "tests/support/child_process.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

int64_t MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now() - t0)
      .count();
}

// Threads of one process that need the stopped daemon at once: each call
// ends within its request timeout (bounded here at twice it, for a loaded
// host), not after the calls queued before it have each waited theirs.
TEST(StoppedDaemon, EveryThreadsCallEndsWithinItsRequestTimeout) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  ClientOptions o = d.client_options();
  o.request_timeout_ms = 1000;
  std::unique_ptr<Client> client;
  ASSERT_TRUE(Client::Connect(o, &client).ok());
  uint32_t sid = 0;
  ASSERT_TRUE(client->CreateSession(&sid).ok());
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(client->OpenCache({.session_id = sid, .fingerprint = "f"}, &cache).ok());
  const RowMaker m(4096);
  ASSERT_TRUE(m.Put(*cache, 0).ok());

  const ContinuedAfter continued(d.pid());  // however the test ends
  ASSERT_TRUE(StopProcess(d.pid()));
  // Control requests, and puts that need a new chunk (rows bigger than
  // what the first chunk has left).
  constexpr int kThreads = 8;
  std::vector<int64_t> took_ms(kThreads);
  std::vector<Status> got(kThreads);
  std::vector<std::thread> threads;
  std::vector<uint8_t> big(5u << 20, 1);
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      auto t0 = std::chrono::steady_clock::now();
      got[k] = k % 2 == 0 ? client->CheckSession(sid)
                          : cache->Put(100 + k, big.data(), big.size());
      took_ms[k] = MsSince(t0);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(kill(d.pid(), SIGCONT), 0);
  for (int k = 0; k < kThreads; ++k) {
    fmt::print("thread {}: {} ms: {}\n", k, took_ms[k], got[k].ToString());
    EXPECT_TRUE(got[k].IsUnavailable()) << k << ": " << got[k].ToString();
    EXPECT_LE(took_ms[k], 2 * o.request_timeout_ms)
        << "thread " << k << " waited out the calls queued before its own";
  }
  // Running again: the client reconnects by itself.
  EXPECT_TRUE(client->CheckSession(sid).ok());
  EXPECT_TRUE(cache->Put(200, big.data(), big.size()).ok());
  Row row;
  EXPECT_TRUE(cache->Get(0, &row).ok());
  EXPECT_EQ(m.Verify(0, row.view()), "");
}

}  // namespace
}  // namespace shmcache::test
