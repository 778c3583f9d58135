// The thread safety client.h and cache.h state: "all methods may be called
// concurrently". Every public call of a Cache, and of a Client, from several
// threads at once, each checking what it got; Close() while other threads
// are inside calls, and while a put is on its way to a lease. Run under
// TSan by scripts/sanitize.sh thread. A real daemon per test
// (integration_fixture.h).
#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/integration_fixture.h"

namespace shmcache::test {
namespace {

constexpr int kThreads = 6;
constexpr uint64_t kRows = 256;

// Whether a view holds row `id`'s pattern, whole.
bool ViewMatches(const RowView& v, uint64_t id) {
  if (v.num_columns() != 1) return false;
  ColumnView c = v.column(0);
  std::vector<uint8_t> want = Pattern(id, 0, RowBytes(id));
  return c.nbytes == want.size() && std::memcmp(c.data, want.data(), want.size()) == 0;
}

// One thread's pass over every Cache call; returns what went wrong ("" for
// nothing). Rows are the patterns of their ids, put by whichever thread
// gets there first.
std::string EveryCacheCall(Cache& cache, int t, bool* claimed, uint64_t* sealed) {
  Row row;
  RowView view;
  std::vector<uint8_t> data;
  for (uint64_t i = 0; i < kRows; ++i) {
    const uint64_t id = (i * 7 + static_cast<uint64_t>(t) * 31) % kRows;
    data = Pattern(id, 0, RowBytes(id));
    int64_t shape[] = {static_cast<int64_t>(data.size())};
    ColumnRef col{"data", DType::kUInt8, shape, data.data(), data.size()};
    Status s;
    switch (i % 4) {
      case 0: s = cache.Put(id, data.data(), data.size()); break;
      case 1: s = cache.Put(id, std::span(&col, 1)); break;
      default: {
        const uint64_t ids[] = {id};
        const std::span<const ColumnRef> rows[] = {std::span(&col, 1)};
        Status st[1];
        s = cache.PutBatch(ids, rows, st);
        if (s.ok()) s = st[0];
      }
    }
    if (!s.ok()) return "put " + std::to_string(id) + ": " + s.ToString();
    if (!cache.Contains(id)) return "Contains(" + std::to_string(id) + ") after its put";
    s = cache.Get(id, &row);
    if (!s.ok() || !RowMatches(row, id, 0, RowBytes(id), true)) {
      return "Get " + std::to_string(id) + ": " + s.ToString();
    }
    const std::string_view only[] = {"data"};
    s = cache.Get(id, only, &row);
    if (!s.ok() || !RowMatches(row, id, 0, RowBytes(id), true)) {
      return "Get(columns) " + std::to_string(id) + ": " + s.ToString();
    }
    s = cache.View(id, &view);
    if (!s.ok() || !ViewMatches(view, id)) return "View " + std::to_string(id);
    const uint64_t ids[] = {id, kRows + id};  // a hit and a miss
    Row rows[2];
    RowView views[2];
    Status st[2];
    s = (i % 2 ? cache.GetBatch(ids, rows, st) : cache.GetBatchUncounted(ids, rows, st));
    if (!s.ok() || !st[0].ok() || !st[1].IsNotFound() ||
        !RowMatches(rows[0], id, 0, RowBytes(id), true)) {
      return "GetBatch " + std::to_string(id) + ": " + s.ToString() + " " +
             st[0].ToString() + " " + st[1].ToString();
    }
    s = (i % 2 ? cache.ViewBatch(ids, views, st)
               : cache.ViewBatchUncounted(ids, views, st));
    if (!s.ok() || !st[0].ok() || !st[1].IsNotFound() || !ViewMatches(views[0], id)) {
      return "ViewBatch " + std::to_string(id) + ": " + s.ToString();
    }
    CacheStats stats;
    if (!cache.GetStats(&stats).ok() || stats.mem_rows == 0) return "GetStats";
    if (cache.IsFull()) return "IsFull on a cache with room";
  }
  Status s = cache.ClaimBuild(claimed);
  if (!s.ok()) return "ClaimBuild: " + s.ToString();
  s = cache.Seal(1000 + static_cast<uint64_t>(t));
  if (!s.ok()) return "Seal: " + s.ToString();
  s = cache.GetSealedRows(sealed);
  if (!s.ok()) return "GetSealedRows: " + s.ToString();
  return "";
}

TEST_F(IntegrationTest, EveryCacheCallFromSeveralThreadsAtOnce) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  std::vector<std::string> errors(kThreads);
  bool claimed[kThreads] = {};
  uint64_t sealed[kThreads] = {};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(
        [&, t] { errors[t] = EveryCacheCall(*cache, t, &claimed[t], &sealed[t]); });
  }
  for (std::thread& th : threads) th.join();
  int claims = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    claims += claimed[t] ? 1 : 0;
    // The first seal wins, and every thread reads that one.
    EXPECT_EQ(sealed[t], sealed[0]) << "thread " << t;
  }
  EXPECT_EQ(claims, 1) << "ClaimBuild is true for exactly one call";
  EXPECT_GE(sealed[0], 1000u);
  EXPECT_LT(sealed[0], 1000u + kThreads);
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, kRows + 2) << "each row once, and the claim and seal records";
}

TEST_F(IntegrationTest, EveryClientCallFromSeveralThreadsAtOnce) {
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server_->Connect(&client).ok());
  std::vector<std::string> errors(kThreads);
  std::vector<uint32_t> cache_ids(kThreads);
  std::vector<uint32_t> sessions(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string& err = errors[t];
      for (int i = 0; i < 10 && err.empty(); ++i) {
        uint32_t id = 0;
        Status s = client->CreateSession(&id);
        if (!s.ok() || id == 0) err = "CreateSession: " + s.ToString();
        if (err.empty() && !(s = client->CheckSession(id)).ok()) {
          err = "CheckSession: " + s.ToString();
        }
        std::unique_ptr<Cache> cache;  // one cache of the shared session, by name
        if (err.empty() && !(s = client->OpenCache(Options(session_), &cache)).ok()) {
          err = "OpenCache: " + s.ToString();
        }
        if (err.empty()) cache_ids[t] = cache->cache_id();
        std::vector<SessionInfo> list;
        if (err.empty() && !(s = client->ListSessions(&list)).ok()) {
          err = "ListSessions: " + s.ToString();
        }
        ServerInfo info;
        if (err.empty() && (!(s = client->GetServerInfo(&info)).ok() || info.pid == 0)) {
          err = "GetServerInfo: " + s.ToString();
        }
        if (err.empty() && !(s = client->DestroySession(id)).ok()) {
          err = "DestroySession: " + s.ToString();
        }
        if (err.empty() && !client->CheckSession(id).IsNotFound()) {
          err = "CheckSession of a destroyed session";
        }
        sessions[t] = id;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    EXPECT_EQ(cache_ids[t], cache_ids[0]) << "one name, one cache";
  }
  std::vector<SessionInfo> list;
  ASSERT_TRUE(client->ListSessions(&list).ok());
  ASSERT_EQ(list.size(), 1u) << "every session a thread made was destroyed";
  EXPECT_EQ(list[0].session_id, session_);
}

// Close() while other threads are inside calls: each call either runs
// (before the close) or fails with InvalidArgument; once a thread has seen
// the cache closed, every later call of its fails so; views taken before
// stay valid and equal (row.h).
TEST_F(IntegrationTest, CloseWhileOtherThreadsCallTheCache) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  for (uint64_t id = 0; id < kRows / 2; ++id) {
    ASSERT_TRUE(PutPattern(*cache, id, 0, RowBytes(id)).ok());
  }
  std::atomic<int> calls{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string& err = errors[t];
      std::vector<std::pair<uint64_t, RowView>> kept;
      bool closed = false;
      // Runs until this thread has seen the close on every kind of call.
      int closed_calls = 0;
      for (uint64_t i = 0; closed_calls < 8 && err.empty(); ++i) {
        const uint64_t id = (i + static_cast<uint64_t>(t) * 17) % kRows;
        Row row;
        RowView view;
        const uint64_t ids[] = {id};
        Row rows[1];
        Status st[1];
        CacheStats stats;
        Status s;
        switch (i % 6) {
          case 0: s = PutPattern(*cache, id, 0, RowBytes(id)); break;
          case 1: s = cache->Get(id, &row); break;
          case 2:
            s = cache->View(id, &view);
            if (s.ok()) kept.emplace_back(id, view);
            break;
          case 3: s = cache->GetBatch(ids, rows, st); break;
          case 4: s = cache->GetStats(&stats); break;
          default:
            if (cache->Contains(id) && closed) err = "Contains true after the close";
            s = closed ? Status::InvalidArgument("closed") : Status::OK();
        }
        calls.fetch_add(1);
        if (s.IsInvalidArgument()) {
          closed = true;
          ++closed_calls;
        } else if (closed) {
          err = "a call after the close: " + s.ToString();
        } else if (!s.ok() && !s.IsNotFound()) {
          err = s.ToString();
        }
      }
      for (const auto& [id, v] : kept) {
        if (!ViewMatches(v, id)) err = "a view taken before the close changed";
      }
    });
  }
  // Close once every thread is well inside its calls.
  // (The threads end only once they see it: close whatever the wait found.)
  EXPECT_TRUE(WaitFor([&] { return calls.load() >= kThreads * 50; }));
  cache->Close();
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

// Close() while another thread's PutBatch is between its usability check and
// its first write: that write must not lease a chunk after Close returned
// the cache's chunks, or the chunk stays leased to the connection (its
// space lost to every other writer) until the client disconnects. The
// cache's budget is one segment of one chunk, so a chunk stranded so shows
// as another connection's put finding the cache full. The batch's first
// rows are cached already (a put passes over them without the writer's
// lock): Close lands in that stretch, between the check and the lease,
// in most iterations.
TEST_F(IntegrationTest, ClosingDuringAPutStrandsNoChunk) {
  std::unique_ptr<Client> a, b;
  ASSERT_TRUE(server_->Connect(&a).ok());
  ASSERT_TRUE(server_->Connect(&b).ok());
  constexpr uint64_t kCached = 20000;
  std::vector<uint64_t> ids(kCached + 1);
  for (uint64_t i = 0; i <= kCached; ++i) ids[i] = i;
  const uint8_t byte = 7;
  const int64_t shape[] = {1};
  const ColumnRef col{"data", DType::kUInt8, shape, &byte, 1};
  const std::vector<std::span<const ColumnRef>> rows(ids.size(), std::span(&col, 1));
  std::vector<Status> statuses(ids.size());
  for (int iter = 0; iter < 40; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const uint32_t session = server_->NewSession();
    ASSERT_NE(session, 0u);
    {
      // Rows 0..kCached-1, put by another connection that then closes:
      // its chunk's tail is free again.
      std::unique_ptr<Cache> first = Open(*b, Options(session, "race", 4));
      ASSERT_TRUE(first);
      ASSERT_TRUE(first
                      ->PutBatch(std::span(ids).first(kCached),
                                 std::span(rows).first(kCached),
                                 std::span(statuses).first(kCached))
                      .ok());
      for (uint64_t i = 0; i < kCached; ++i) ASSERT_TRUE(statuses[i].ok()) << i;
    }
    std::unique_ptr<Cache> cache = Open(*a, Options(session, "race", 4));
    ASSERT_TRUE(cache);
    std::atomic<bool> started{false};
    Status put;
    std::thread writer([&] {
      std::vector<Status> st(ids.size());
      started.store(true);
      put = cache->PutBatch(ids, rows, st);
      if (put.ok()) put = st[kCached];
    });
    while (!started.load()) {
    }
    // One round trip to the daemon: the writer is then well inside its
    // stretch of cached rows, past the check (whichever it is, the test
    // holds).
    ServerInfo info;
    ASSERT_TRUE(b->GetServerInfo(&info).ok());
    cache->Close();
    writer.join();
    ASSERT_TRUE(put.ok() || put.IsInvalidArgument()) << put.ToString();
    // The chunk's tail is free for another connection's row.
    std::unique_ptr<Cache> other = Open(*b, Options(session, "race", 4));
    ASSERT_TRUE(other);
    Status s = PutPattern(*other, kCached + 1, 0, 64);
    ASSERT_TRUE(s.ok()) << s.ToString() << " (the closed cache's put "
                        << (put.ok() ? "stored its row" : "was refused") << ")";
    other.reset();
    cache.reset();
    ASSERT_TRUE(b->DestroySession(session).ok());
  }
}

}  // namespace
}  // namespace shmcache::test
