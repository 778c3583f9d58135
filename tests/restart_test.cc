// A daemon killed with SIGKILL, then started again on the same instance:
// it adopts the sessions, caches and spilled rows it left and serves every
// row committed before the kill; what it cannot trust it discards.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "format/layout.h"
#include "shmcache/client.h"
#include "tests/support/child_process.h"
#include "tests/support/test_server.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {
namespace {

constexpr size_t kRowBytes = 3072;

// True when some line of `out` is "Warning: cache <id> " followed by `text`
// (cache ids are random).
bool HasWarning(const std::string& out, const std::string& text) {
  for (size_t at = out.find(text); at != std::string::npos; at = out.find(text, at + 1)) {
    size_t line = out.rfind('\n', at);
    line = line == std::string::npos ? 0 : line + 1;
    std::string head = out.substr(line, at - line);
    if (head.rfind("Warning: cache ", 0) == 0 && head.size() > 16 && head.back() == ' ' &&
        head.find_first_not_of("0123456789", 15) == head.size() - 1) {
      return true;
    }
  }
  return false;
}

Status Open(const TestServer& server, uint32_t session, std::unique_ptr<Client>* client,
            std::unique_ptr<Cache>* cache) {
  Status s = server.Connect(client);
  if (!s.ok()) return s;
  return (*client)->OpenCache(CacheNamed(session, "restart", 1, true), cache);
}

TEST(RestartTest, RestartedDaemonServesEveryCommittedRow) {
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
  {
    auto first = std::make_unique<TestServer>(WithArgs({"-s", spill}));
    ASSERT_TRUE(first->ok()) << first->start_result().Describe();
    uint32_t session = first->NewSession();
    uint32_t empty_session = first->NewSession();
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    ASSERT_TRUE(Open(*first, session, &client, &cache).ok());
    const size_t rows = (4u << 20) / kRowBytes;  // 1 MB in memory, the rest on disk
    std::vector<uint8_t> row(kRowBytes);
    for (size_t i = 0; i < rows; ++i) {
      FillPattern(i, 3, row.data(), row.size());
      ASSERT_TRUE(cache->Put(i, row.data(), row.size()).ok()) << i;
    }
    CacheStats before;
    ASSERT_TRUE(cache->GetStats(&before).ok());
    ASSERT_GT(before.disk_rows, 0u);
    ASSERT_GT(before.mem_rows, 0u);

    first->Kill();
    // The old client notices: a request fails within its timeout, a hit
    // from mapped memory still works.
    uint32_t unused;
    EXPECT_TRUE(client->CreateSession(&unused).IsUnavailable());
    Row got;
    EXPECT_TRUE(cache->Get(0, &got).ok());

    TestServer second(SameInstance(*first, {"-s", spill}));
    ASSERT_TRUE(second.ok()) << second.start_result().Describe();
    CommandResult list = second.Admin({"--list_sessions"});
    EXPECT_NE(list.out.find(std::to_string(empty_session)), std::string::npos)
        << list.out;

    // The same client object reconnects by itself and reads everything,
    // memory and disk rows alike.
    size_t served = 0;
    for (size_t i = 0; i < rows; ++i) {
      Status s = cache->Get(i, &got);
      ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
      auto col = got.find("data");
      ASSERT_TRUE(col.has_value());
      ASSERT_EQ(0, std::memcmp(col->data, Pattern(i, 3, kRowBytes).data(), kRowBytes))
          << i;
      ++served;
    }
    EXPECT_EQ(served, rows);
    // A new client in a new process sees the adopted cache too.
    pid_t pid = ForkChild([&]() -> int {
      std::unique_ptr<Client> c2;
      std::unique_ptr<Cache> k2;
      if (!Open(second, session, &c2, &k2).ok()) return 2;
      Row r;
      for (size_t i = 0; i < rows; ++i) {
        if (!k2->Get(i, &r).ok()) return 3;
      }
      std::vector<uint8_t> more(kRowBytes, 9);
      return k2->Put(rows + 1, more.data(), more.size()).ok() ? 0 : 4;
    });
    EXPECT_EQ(WaitChild(pid), 0);
    std::fprintf(stderr, "restart: %zu of %zu committed rows served after SIGKILL\n",
                 served, rows);
    cache.reset();
    client.reset();
  }
  EXPECT_TRUE(ListDir(spill).empty());
}

// A client that asked the daemon nothing while it was down (its hits and
// spilled rows need no daemon) holds a connection the killed daemon closed
// without knowing it: its first request to the restarted daemon is
// answered too, not failed with "Broken pipe" (which the Python layer
// answers by reading from the source for the rest of the run).
TEST(RestartTest, AClientThatAskedNothingWhileTheDaemonWasDownIsAnsweredByTheNextOne) {
  auto first = std::make_unique<TestServer>();
  ASSERT_TRUE(first->ok()) << first->start_result().Describe();
  const uint32_t session = first->NewSession();
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(first->Connect(&client).ok());
  ASSERT_TRUE(client->OpenCache(CacheNamed(session, "restart", 1, false), &cache).ok());
  std::vector<uint8_t> row(kRowBytes);
  FillPattern(0, 3, row.data(), row.size());
  ASSERT_TRUE(cache->Put(0, row.data(), row.size()).ok());

  first->Kill();
  Row got;
  ASSERT_TRUE(cache->Get(0, &got).ok());
  TestServer second(SameInstance(*first, {}));
  ASSERT_TRUE(second.ok()) << second.start_result().Describe();

  Status checked = client->CheckSession(session);
  EXPECT_TRUE(checked.ok()) << checked.ToString();
  cache.reset();
  client.reset();
}

// Whether thread `tid` of this process is waiting for an answer: in poll
// (lib/connection.cc waits there, then receives) or recvmsg.
bool WaitsForAnswer(pid_t tid) {
  std::ifstream f(fmt::format("/proc/self/task/{}/syscall", tid));
  long nr = -1;
  if (!(f >> nr)) return false;
#ifdef SYS_poll  // not on aarch64, where glibc's poll() is ppoll
  if (nr == SYS_poll) return true;
#endif
  return nr == SYS_ppoll || nr == SYS_recvmsg;
}

// A request the daemon had (sent whole) when it was killed may have been
// carried out: it is not sent again to the restarted daemon (a session
// created twice, a lease granted twice), and the caller is told why in
// words: before, "unreachable (connection closed)", which said neither
// that the server went while it had the request nor what became of it.
// The next request is answered by the restarted daemon.
TEST(RestartTest, ARequestTheKilledDaemonHadIsNotSentAgainAndSaysWhy) {
  auto first = std::make_unique<TestServer>();
  ASSERT_TRUE(first->ok()) << first->start_result().Describe();
  const uint32_t session = first->NewSession();
  ClientOptions o = first->client_options();
  o.request_timeout_ms = 120000;  // the answer is waited for until the kill
  std::unique_ptr<Client> client;
  ASSERT_TRUE(Client::Connect(o, &client).ok());
  ASSERT_TRUE(client->CheckSession(session).ok());
  // Stopped, the daemon reads nothing: the request lies whole in its
  // socket when it is killed.
  const ContinuedAfter continued(first->pid());  // however the test ends
  ASSERT_TRUE(StopProcess(first->pid()));
  std::atomic<pid_t> tid{0};
  Status created;
  uint32_t made = 0;
  std::thread asker([&] {
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    created = client->CreateSession(&made);
  });
  const bool asked =
      WaitFor([&] { return tid != 0 && WaitsForAnswer(tid); }, std::chrono::seconds(60));
  first->Kill();
  asker.join();
  ASSERT_TRUE(asked) << "the request was never waiting for its answer";
  EXPECT_TRUE(created.IsUnavailable()) << created.ToString();
  EXPECT_NE(created.message().find("closed the connection before it answered"),
            std::string::npos)
      << created.ToString();
  EXPECT_NE(created.message().find("not sent again"), std::string::npos)
      << created.ToString();

  TestServer second(SameInstance(*first, {}));
  ASSERT_TRUE(second.ok()) << second.start_result().Describe();
  std::vector<SessionInfo> sessions;
  ASSERT_TRUE(client->ListSessions(&sessions).ok()) << "the next request reconnects";
  ASSERT_EQ(sessions.size(), 1u) << "the create was sent again";
  EXPECT_EQ(sessions[0].session_id, session);
  client.reset();
}

// Puts rows 0..n-1 into the "restart" cache (1 MB, spilling) of a server
// with a spill dir; returns how many stayed in memory: ids below that, as
// rows spill only once memory is used up.
size_t FillPastMemory(const TestServer& server, uint32_t session, size_t n) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  EXPECT_TRUE(Open(server, session, &client, &cache).ok());
  std::vector<uint8_t> row(kRowBytes);
  for (size_t i = 0; i < n; ++i) {
    FillPattern(i, 3, row.data(), row.size());
    EXPECT_TRUE(cache->Put(i, row.data(), row.size()).ok()) << i;
  }
  CacheStats st;
  EXPECT_TRUE(cache->GetStats(&st).ok());
  EXPECT_GT(st.disk_rows, 0u);
  EXPECT_EQ(st.mem_rows + st.disk_rows, n);
  return st.mem_rows;
}

// After a restart that dropped the spilled rows: rows in memory are served,
// spilled ones are misses, and a put caches them again (spill) or is
// refused as full (no spill dir), as --list_sessions says.
void ExpectSpilledRowsDropped(const TestServer& server, uint32_t session, size_t n,
                              size_t in_memory, bool spill) {
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(client->OpenCache(CacheNamed(session, "restart", 1, spill), &cache).ok());
  Row got;
  std::vector<uint8_t> row(kRowBytes);
  for (size_t i = 0; i < n; ++i) {
    if (i < in_memory) {
      ASSERT_TRUE(cache->Get(i, &got).ok()) << i;
      continue;
    }
    ASSERT_FALSE(cache->Contains(i)) << i;
    ASSERT_TRUE(cache->Get(i, &got).IsNotFound()) << i;
    FillPattern(i, 3, row.data(), row.size());
    bool inserted = false;
    Status s = cache->Put(i, row.data(), row.size(), &inserted);
    if (!spill) {
      ASSERT_TRUE(s.IsFull()) << i << ": " << s.ToString();
      continue;
    }
    ASSERT_TRUE(s.ok() && inserted) << i << ": " << s.ToString();
    ASSERT_TRUE(cache->Get(i, &got).ok()) << i;
    auto col = got.find("data");
    ASSERT_TRUE(col.has_value());
    ASSERT_EQ(0, std::memcmp(col->data, row.data(), kRowBytes)) << i;
  }
  EXPECT_EQ(cache->IsFull(), !spill);
  CommandResult list = server.Admin({"--list_sessions", "--json"});
  EXPECT_NE(list.out.find(fmt::format("\"disk_cached\": {},", spill ? n - in_memory : 0)),
            std::string::npos)
      << list.out;
  EXPECT_NE(list.out.find(spill ? "\"full\": false" : "\"full\": true"),
            std::string::npos)
      << list.out;
}

// A server that spilled part of a cache to `dir` and was killed: what the
// restarts below find.
struct Spilled {
  std::unique_ptr<TestServer> server;
  uint32_t session = 0;
  size_t rows = (4u << 20) / kRowBytes;
  size_t in_memory = 0;
};

void SpillThenKill(const std::string& dir, Spilled* out) {
  out->server = std::make_unique<TestServer>(WithArgs({"-s", dir}));
  ASSERT_TRUE(out->server->ok()) << out->server->start_result().Describe();
  out->session = out->server->NewSession();
  out->in_memory = FillPastMemory(*out->server, out->session, out->rows);
  out->server->Kill();
}

TEST(RestartTest, AnotherSpillDirDropsSpilledRowsWhichCanBeCachedAgain) {
  TempDir old_tmp(TestTmpRoot());
  const std::string& old_dir = old_tmp.path();
  TempDir new_tmp(TestTmpRoot());
  const std::string& new_dir = new_tmp.path();
  {
    Spilled k;
    ASSERT_NO_FATAL_FAILURE(SpillThenKill(old_dir, &k));
    TestServer* first = k.server.get();
    const uint32_t session = k.session;
    const size_t rows = k.rows, in_memory = k.in_memory;
    ASSERT_FALSE(ListDir(old_dir).empty());

    TestServer second(SameInstance(*first, {"-s", new_dir}));
    ASSERT_TRUE(second.ok()) << second.start_result().Describe();
    const std::string& out = second.start_result().out;
    EXPECT_TRUE(HasWarning(out, fmt::format("(session {}, 'restart'): {} spilled rows "
                                            "were dropped (this server spills to {}/",
                                            session, rows - in_memory, new_dir)))
        << out;
    EXPECT_NE(out.find("Warning: removed " + old_dir + "/"), std::string::npos) << out;
    EXPECT_TRUE(ListDir(old_dir).empty()) << testing::PrintToString(ListDir(old_dir));
    EXPECT_NE(second.ReadLog().find("spilled rows were dropped"), std::string::npos);
    ExpectSpilledRowsDropped(second, session, rows, in_memory, true);
  }
  EXPECT_TRUE(ListDir(old_dir).empty());
  EXPECT_TRUE(ListDir(new_dir).empty());
}

// The spill record names a database a restarted server destroys: one that
// is not the server's own file (here a symbolic link someone planted in its
// place) is ignored, and the database it names is left alone.
TEST(RestartTest, APlantedSpillRecordIsIgnoredAndDestroysNothing) {
  TempDir old_tmp(TestTmpRoot());
  const std::string& old_dir = old_tmp.path();
  TempDir new_tmp(TestTmpRoot());
  const std::string& new_dir = new_tmp.path();
  {
    Spilled k;
    ASSERT_NO_FATAL_FAILURE(SpillThenKill(old_dir, &k));
    TestServer* first = k.server.get();
    const uint32_t session = k.session;
    const size_t rows = k.rows, in_memory = k.in_memory;
    std::string record = first->shm_dir() + "/" + first->shm_prefix() + "spilldb";
    std::string planted = first->shm_dir() + "/planted-record";
    ASSERT_EQ(rename(record.c_str(), planted.c_str()), 0) << strerror(errno);
    ASSERT_EQ(symlink(planted.c_str(), record.c_str()), 0) << strerror(errno);

    TestServer second(SameInstance(*first, {"-s", new_dir}));
    ASSERT_TRUE(second.ok()) << second.start_result().Describe();
    const std::string& out = second.start_result().out;
    EXPECT_NE(out.find("Warning: ignored the spill record: "), std::string::npos) << out;
    EXPECT_NE(out.find("is a symbolic link"), std::string::npos) << out;
    EXPECT_FALSE(ListDir(old_dir).empty()) << "a planted record destroyed a database";
    ExpectSpilledRowsDropped(second, session, rows, in_memory, true);
    unlink(planted.c_str());
  }
}

TEST(RestartTest, NoSpillDirDropsSpilledRowsAndTheFullCacheSaysFull) {
  TempDir old_tmp(TestTmpRoot());
  const std::string& old_dir = old_tmp.path();
  {
    Spilled k;
    ASSERT_NO_FATAL_FAILURE(SpillThenKill(old_dir, &k));
    TestServer* first = k.server.get();
    const uint32_t session = k.session;
    const size_t rows = k.rows, in_memory = k.in_memory;

    TestServer second(SameInstance(*first, {}));
    ASSERT_TRUE(second.ok()) << second.start_result().Describe();
    const std::string& out = second.start_result().out;
    EXPECT_TRUE(HasWarning(out, fmt::format("(session {}, 'restart'): {} spilled rows "
                                            "were dropped (this server has no spill "
                                            "directory)",
                                            session, rows - in_memory)))
        << out;
    EXPECT_NE(out.find("it no longer spills and is full"), std::string::npos) << out;
    EXPECT_TRUE(ListDir(old_dir).empty()) << testing::PrintToString(ListDir(old_dir));
    ExpectSpilledRowsDropped(second, session, rows, in_memory, false);
    CommandResult table = second.Admin({"--list_sessions"});
    EXPECT_NE(table.out.find("yes"), std::string::npos) << table.out;
  }
  EXPECT_TRUE(ListDir(old_dir).empty());
}

// Puts `bytes` of rows (ids from 0) into a new cache `name` of `size_mb`,
// then kills the server.
void FillThenKill(TestServer* server, uint32_t session, const char* name,
                  uint64_t size_mb, uint64_t bytes) {
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server->Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(client->OpenCache(CacheNamed(session, name, size_mb, false), &cache).ok());
  std::vector<uint8_t> row(kRowBytes, 5);
  for (uint64_t i = 0; i < bytes / kRowBytes; ++i) {
    ASSERT_TRUE(cache->Put(i, row.data(), row.size()).ok()) << i;
  }
  cache.reset();
  client.reset();
  server->Kill();
}

TEST(RestartTest, CacheOverALowerMemoryCapIsDiscardedAndStartSaysSo) {
  auto first = std::make_unique<TestServer>();
  ASSERT_TRUE(first->ok());
  uint32_t session = first->NewSession();
  ASSERT_NO_FATAL_FAILURE(FillThenKill(first.get(), session, "big", 64, 48u << 20));
  TestServer second(SameInstance(*first, {"--memory_cap_mb", "32"}));
  ASSERT_TRUE(second.ok()) << second.start_result().Describe();
  const std::string& out = second.start_result().out;
  EXPECT_NE(out.find("successfully"), std::string::npos) << out;
  EXPECT_TRUE(HasWarning(out, "left by the earlier server was discarded: it holds "))
      << out;
  EXPECT_NE(out.find(fmt::format("MB (session {}, 'big'), more than is left under the "
                                 "memory cap of 32 MB",
                                 session)),
            std::string::npos)
      << out;
}

TEST(RestartTest, LayoutItCannotTrustIsDiscardedNotServed) {
  auto first = std::make_unique<TestServer>();
  ASSERT_TRUE(first->ok());
  uint32_t session = first->NewSession();
  ASSERT_NO_FATAL_FAILURE(FillThenKill(first.get(), session, "v", 0, kRowBytes));
  // Pretend the segment was written by another layout version.
  // The segment holding the row: the cache's first (a second one may be
  // the next segment, prepared in the background).
  std::string seg;
  for (const std::string& n : first->ShmFiles()) {
    if (n.size() > 2 && n.find(".seg.") != std::string::npos &&
        n.compare(n.size() - 2, 2, ".0") == 0) {
      seg = first->shm_dir() + "/" + n;
    }
  }
  ASSERT_FALSE(seg.empty());
  int fd = open(seg.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint32_t version = layout::kLayoutVersion + 1;
  ASSERT_EQ(pwrite(fd, &version, sizeof version, offsetof(layout::FileHeader, version)),
            static_cast<ssize_t>(sizeof version));
  close(fd);

  TestServer second(SameInstance(*first, {}));
  ASSERT_TRUE(second.ok()) << second.start_result().Describe();
  // The cache's files are gone; the session survives and the row is not
  // served from memory nobody can vouch for.
  for (const std::string& n : second.ShmFiles()) {
    EXPECT_EQ(n.find(".seg."), std::string::npos) << n;
  }
  std::unique_ptr<Client> client;
  ASSERT_TRUE(second.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(client->OpenCache(CacheNamed(session, "v", 0, false), &cache).ok());
  Row got;
  EXPECT_TRUE(cache->Get(0, &got).IsNotFound());
  std::string log = second.ReadLog();
  EXPECT_NE(log.find("layout version differs"), std::string::npos) << log;
}

}  // namespace
}  // namespace shmcache::test
