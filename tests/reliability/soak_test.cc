// Soak: 5 processes mix put, get, view, projection, stats and session
// destroy for $SHMCACHE_SOAK_SECONDS (default 30 s), verifying every byte
// they read; at the end the counts must agree with what the cache holds.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

constexpr int kMixers = 4;
constexpr uint64_t kPool = 20000;        // ids every mixer may put (races)
constexpr uint64_t kPrivateCap = 20000;  // own ids per mixer
uint64_t PrivateId(int w, uint64_t i) { return (static_cast<uint64_t>(w) + 1) << 32 | i; }

struct Shared {
  std::atomic<bool> stop{false};
  std::atomic<uint32_t> churn_session{0};
  std::atomic<uint64_t> private_puts[kMixers];
  std::atomic<uint64_t> pool_inserted{0}, verified{0}, wrong{0}, errors{0}, ops{0},
      destroyed_seen{0}, sessions_churned{0}, stats_calls{0};
  std::atomic<int> msg_taken{0};
  char msg[1024];
  void Fail(const std::string& m) {
    errors.fetch_add(1);
    if (msg_taken.exchange(1) == 0) std::snprintf(msg, sizeof msg, "%s", m.c_str());
  }
};

int Mixer(const TestDaemon& d, uint32_t sid, const RowMaker& m, Shared* sh, int w) {
  std::unique_ptr<Client> c;
  std::unique_ptr<Cache> cache, churn;
  uint32_t churn_sid = 0;
  Status s = Client::Connect(d.client_options(), &c);
  if (s.ok()) s = c->OpenCache({.session_id = sid, .fingerprint = "soak"}, &cache);
  if (!s.ok()) {
    sh->Fail("open: " + s.ToString());
    return 2;
  }
  std::mt19937_64 rng(static_cast<uint64_t>(w) * 7 + 1);
  Row row;
  RowView view;
  std::string_view proj[2] = {"sum", "data"};
  uint64_t mine = 0;
  auto check = [&](uint64_t id, const Status& st, const std::string& bad, bool miss_ok) {
    if (st.IsNotFound() && miss_ok) return;
    if (!st.ok()) return sh->Fail(fmt::format("row {}: {}", id, st.ToString()));
    if (!bad.empty()) {
      sh->wrong.fetch_add(1);
      return sh->Fail(fmt::format("row {}: {}", id, bad));
    }
    sh->verified.fetch_add(1, std::memory_order_relaxed);
  };
  while (!sh->stop.load(std::memory_order_relaxed)) {
    sh->ops.fetch_add(1, std::memory_order_relaxed);
    int op = static_cast<int>(rng() % 100);
    if (op < 10 && mine < kPrivateCap) {  // put an own row, read it back
      uint64_t id = PrivateId(w, mine);
      s = m.Put(*cache, id);
      if (!s.ok()) {
        sh->Fail("put: " + s.ToString());
        continue;
      }
      sh->private_puts[w].store(++mine);
      s = cache->Get(id, &row);
      check(id, s, s.ok() ? m.Verify(id, row.view()) : "", false);
    } else if (op < 20) {  // race the others on a shared id
      uint64_t id = rng() % kPool;
      bool inserted = false;
      s = m.Put(*cache, id, &inserted);
      if (!s.ok()) sh->Fail("pool put: " + s.ToString());
      if (inserted) sh->pool_inserted.fetch_add(1);
    } else if (op < 75) {  // read anything that may exist
      int who = static_cast<int>(rng() % kMixers);
      uint64_t n = sh->private_puts[who].load();
      bool pool = rng() % 2 == 0 || n == 0;
      uint64_t id = pool ? rng() % kPool : PrivateId(who, rng() % n);
      int mode = static_cast<int>(rng() % 3);
      std::string bad;
      if (mode == 0) {
        s = cache->Get(id, &row);
        if (s.ok()) bad = m.Verify(id, row.view());
      } else if (mode == 1) {
        s = cache->View(id, &view);
        if (s.ok()) bad = m.Verify(id, view);
      } else {
        s = cache->Get(id, proj, &row);
        if (s.ok()) bad = m.VerifyProjection(id, row.view());
      }
      check(id, s, bad, pool);
    } else if (op < 80) {  // stats
      CacheStats st;
      s = cache->GetStats(&st);
      if (!s.ok() || (st.mem_rows == 0 && mine > 0)) sh->Fail("stats: " + s.ToString());
      sh->stats_calls.fetch_add(1, std::memory_order_relaxed);
    } else {  // the churn session, which the churner destroys at any time
      uint32_t cur = sh->churn_session.load();
      if (cur == 0) continue;
      if (cur != churn_sid || !churn) {
        churn.reset();
        s = c->OpenCache({.session_id = cur, .fingerprint = "churn"}, &churn);
        if (s.IsNotFound()) {
          sh->destroyed_seen.fetch_add(1);
          continue;
        }
        if (!s.ok()) {
          sh->Fail("open churn: " + s.ToString());
          continue;
        }
        churn_sid = cur;
      }
      uint64_t id = rng() % 2000;
      s = rng() % 2 ? m.Put(*churn, id) : churn->Get(id, &row);
      if (s.IsNotFound()) {
        // A miss, or the session is gone: both are fine.
        if (c->CheckSession(cur).IsNotFound()) sh->destroyed_seen.fetch_add(1);
        continue;
      }
      if (!s.ok()) {
        if (c->CheckSession(cur).IsNotFound()) {
          sh->destroyed_seen.fetch_add(1);
          continue;
        }
        sh->Fail("churn op: " + s.ToString());
        continue;
      }
      s = churn->Get(id, &row);
      if (s.IsNotFound()) continue;  // destroyed in between
      check(id, s, s.ok() ? m.Verify(id, row.view()) : "", true);
    }
  }
  return 0;
}

int Churner(const TestDaemon& d, const RowMaker& m, Shared* sh) {
  std::unique_ptr<Client> c;
  if (!Client::Connect(d.client_options(), &c).ok()) return 2;
  while (!sh->stop.load()) {
    uint32_t sid;
    std::unique_ptr<Cache> cache;
    Status s = c->CreateSession(&sid);
    if (s.ok()) s = c->OpenCache({.session_id = sid, .fingerprint = "churn"}, &cache);
    if (!s.ok()) {
      sh->Fail("churn create: " + s.ToString());
      return 3;
    }
    for (uint64_t id = 0; id < 500; ++id) {
      if (Status p = m.Put(*cache, id); !p.ok()) sh->Fail("churn put: " + p.ToString());
    }
    sh->churn_session.store(sid);
    usleep(50000);  // a short-lived dataset; readers come and go meanwhile
    cache.reset();
    if (Status d = c->DestroySession(sid); !d.ok()) sh->Fail("destroy: " + d.ToString());
    sh->sessions_churned.fetch_add(1);
  }
  return 0;
}

TEST(Soak, MixedLoadVerifiesEveryByte) {
  const double seconds = EnvSeconds("SHMCACHE_SOAK_SECONDS", 30);
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  SessionCache sc;
  ASSERT_TRUE(OpenSessionCache(d, "soak", &sc).ok());
  std::unique_ptr<Client>& c = sc.client;
  const uint32_t sid = sc.session;
  std::unique_ptr<Cache>& cache = sc.cache;
  const RowMaker m(8192);
  Shared* sh = SharedBlock<Shared>();
  std::vector<pid_t> kids;
  kids.reserve(kMixers + 1);
  for (int w = 0; w < kMixers; ++w) {
    kids.push_back(ForkChild([&, w] { return Mixer(d, sid, m, sh, w); }));
  }
  kids.push_back(ForkChild([&] { return Churner(d, m, sh); }));
  // The run's length: a plain wait, nothing to wait for.
  WaitFor([&] { return sh->errors.load() > 0; },
          std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  sh->stop.store(true);
  for (pid_t p : kids) {
    int st = 0;
    bool ended = WaitChild(p, &st, std::chrono::seconds(30));
    if (!ended) {
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
    }
    EXPECT_TRUE(ended) << "a soak process hung";
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << DescribeStatus(st);
  }
  // Everything written is there, once, byte for byte.
  Row row;
  uint64_t private_rows = 0, pool_rows = 0;
  for (int w = 0; w < kMixers; ++w) {
    for (uint64_t i = 0; i < sh->private_puts[w].load(); ++i) {
      uint64_t id = PrivateId(w, i);
      ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
      ASSERT_EQ(m.Verify(id, row.view()), "") << id;
      ++private_rows;
    }
  }
  for (uint64_t id = 0; id < kPool; ++id) {
    Status s = cache->Get(id, &row);
    if (s.IsNotFound()) continue;
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(m.Verify(id, row.view()), "") << id;
    ++pool_rows;
  }
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  fmt::print(
      "soak figures: {:.0f} s, {} ops, {} reads verified, wrong {}, errors {}, "
      "{} stats calls, {} sessions created and destroyed ({} destroyed "
      "sessions met by readers); {} own rows + {} raced rows ({} inserts "
      "won), cache holds {}\n",
      seconds, sh->ops.load(), sh->verified.load(), sh->wrong.load(), sh->errors.load(),
      sh->stats_calls.load(), sh->sessions_churned.load(), sh->destroyed_seen.load(),
      private_rows, pool_rows, sh->pool_inserted.load(), st.mem_rows);
  EXPECT_EQ(sh->wrong.load(), 0u) << sh->msg;
  // The daemon's log shows what a request that timed out was waiting for.
  EXPECT_EQ(sh->errors.load(), 0u) << sh->msg << "\nthe daemon's log:\n" << d.ReadLog();
  EXPECT_GT(sh->verified.load(), 1000u);
  EXPECT_GT(sh->sessions_churned.load(), 0u);
  EXPECT_EQ(pool_rows, sh->pool_inserted.load()) << "first writer wins, once";
  EXPECT_EQ(st.mem_rows, private_rows + pool_rows);
  cache.reset();
  c.reset();
  EXPECT_TRUE(d.Stop().ok());
  EXPECT_TRUE(d.ShmFiles().empty());
}

}  // namespace
}  // namespace shmcache::test
