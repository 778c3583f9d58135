// A client whose control connection breaks while its process lives on may
// still write into the chunks it holds: the daemon must not hand their
// unused tails to anyone else. (A dead process's tails are recycled; see
// the writer-kill test.)
#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shmcache/client.h"
#include "tests/support/test_server.h"

namespace shmcache::test {
namespace {

constexpr size_t kRowBytes = 3072;
constexpr uint64_t kRowsEach = 1000;  // ~3 MB: inside one 4 MB chunk

// Shuts down every socket of this process: the daemon sees its end of the
// connection close, while the process goes on.
void BreakMyConnections() {
  DIR* d = opendir("/proc/self/fd");
  ASSERT_NE(d, nullptr);
  std::vector<int> fds;
  while (dirent* e = readdir(d)) {
    char target[64] = {};
    std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(link.c_str(), target, sizeof target - 1) > 0 &&
        std::strncmp(target, "socket:", 7) == 0) {
      fds.push_back(std::atoi(e->d_name));
    }
  }
  closedir(d);
  for (int fd : fds) shutdown(fd, SHUT_RDWR);
}

int PutRange(Cache* cache, uint64_t first, uint64_t count, uint64_t salt) {
  std::vector<uint8_t> row(kRowBytes);
  for (uint64_t i = first; i < first + count; ++i) {
    FillPattern(i, salt, row.data(), row.size());
    if (!cache->Put(i, row.data(), row.size()).ok()) return 1;
  }
  return 0;
}

TEST(BrokenConnectionTest, LiveClientKeepsItsChunksAfterItsConnectionBreaks) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  int to_a[2], from_a[2];
  ASSERT_EQ(pipe(to_a), 0);
  ASSERT_EQ(pipe(from_a), 0);
  pid_t a = ForkChild([&]() -> int {
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    if (!server.Connect(&client).ok()) return 2;
    if (!client->OpenCache(CacheNamed(session, "c", 0, false), &cache).ok()) return 3;
    if (PutRange(cache.get(), 0, 1, 1) != 0) return 4;  // leases a chunk
    BreakMyConnections();
    char c = 'd';
    if (write(from_a[1], &c, 1) != 1 || read(to_a[0], &c, 1) != 1) return 5;
    // Still in the chunk leased before: no daemon needed.
    return PutRange(cache.get(), 1, kRowsEach - 1, 1) == 0 ? 0 : 6;
  });
  char c;
  ASSERT_EQ(read(from_a[0], &c, 1), 1);
  // Another process takes chunks while A's connection is gone.
  pid_t b = ForkChild([&]() -> int {
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    if (!server.Connect(&client).ok()) return 2;
    if (!client->OpenCache(CacheNamed(session, "c", 0, false), &cache).ok()) return 3;
    return PutRange(cache.get(), kRowsEach, kRowsEach, 2);
  });
  EXPECT_EQ(WaitChild(b), 0);
  ASSERT_EQ(write(to_a[1], "g", 1), 1);
  EXPECT_EQ(WaitChild(a), 0);

  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  ASSERT_TRUE(server.Connect(&client).ok());
  ASSERT_TRUE(client->OpenCache(CacheNamed(session, "c", 0, false), &cache).ok());
  Row row;
  for (uint64_t i = 0; i < 2 * kRowsEach; ++i) {
    Status s = cache->Get(i, &row);
    ASSERT_TRUE(s.ok()) << "row " << i << ": " << s.ToString();
    auto col = row.find("data");
    ASSERT_TRUE(col.has_value());
    std::vector<uint8_t> want = Pattern(i, i < kRowsEach ? 1 : 2, kRowBytes);
    ASSERT_EQ(0, std::memcmp(col->data, want.data(), kRowBytes)) << "row " << i;
  }
  for (int fd : {to_a[0], to_a[1], from_a[0], from_a[1]}) close(fd);
}

std::string ReadLogs(const TestServer& server) {
  std::string all;
  for (const std::string& f : ListDir(server.run_dir() + "/log")) {
    std::ifstream in(server.run_dir() + "/log/" + f);
    all.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return all;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

// A child that opens a client, runs `body` with it, and then stays alive
// (its connections ended) until `hold` is written to.
pid_t LiveClient(const TestServer& server, int hold, int done,
                 const std::function<int(const TestServer&)>& body) {
  return ForkChild([&server, hold, done, body]() -> int {
    int rc = body(server);
    char c = 'd';
    if (write(done, &c, 1) != 1 || read(hold, &c, 1) != 1) return 9;
    return rc;
  });
}

TEST(BrokenConnectionTest, ALiveProcessDroppingManyConnectionsIsLoggedOnce) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  int hold[2], done[2];
  ASSERT_EQ(pipe(hold), 0);
  ASSERT_EQ(pipe(done), 0);
  // A opens and drops 20 clients, each with a cache and a chunk, as a
  // trainer dropping DatasetCache objects does, and lives on.
  constexpr int kDropped = 20;
  pid_t a = LiveClient(server, hold[0], done[1], [session](const TestServer& s) {
    for (int i = 0; i < kDropped; ++i) {
      std::unique_ptr<Client> client;
      std::unique_ptr<Cache> cache;
      if (!s.Connect(&client).ok()) return 2;
      if (!client->OpenCache(CacheNamed(session, "c", 0, false), &cache).ok()) return 3;
      if (PutRange(cache.get(), i, 1, 1) != 0) return 4;
    }
    return 0;
  });
  char c;
  ASSERT_EQ(read(done[0], &c, 1), 1);
  // B drops one connection after all of A's ended: once B's is settled (the
  // daemon settles them in order), so are all of A's.
  pid_t b = LiveClient(server, hold[0], done[1], [](const TestServer& s) {
    std::unique_ptr<Client> client;
    uint32_t id = 0;
    return s.Connect(&client).ok() && client->CreateSession(&id).ok() ? 0 : 2;
  });
  ASSERT_EQ(read(done[0], &c, 1), 1);
  // The old wording ("connection N of live process P ended") matches too.
  auto about = [](pid_t pid) { return "process " + std::to_string(pid) + " ended"; };
  const std::string about_b = about(b);
  EXPECT_TRUE(WaitFor([&] { return Count(ReadLogs(server), about_b) == 1; },
                      std::chrono::seconds(60)))
      << ReadLogs(server);
  const std::string about_a = about(a);
  EXPECT_EQ(Count(ReadLogs(server), about_a), 1u) << ReadLogs(server);
  ASSERT_EQ(write(hold[1], "gg", 2), 2);
  EXPECT_EQ(WaitChild(a), 0);
  EXPECT_EQ(WaitChild(b), 0);
  for (int fd : {hold[0], hold[1], done[0], done[1]}) close(fd);
}

// A lease whose answer never came (the daemon was stopped past the request
// timeout, then went on): the daemon granted it and took the old chunk's
// tail back, so the writer must not write there again, or the next writer
// given that tail shares its bytes.
TEST(BrokenConnectionTest, AChunkTradedForALeaseWhoseAnswerWasLostIsNotWrittenAgain) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  ClientOptions short_wait = server.client_options();
  // Short enough to give up on a stopped daemon soon, long enough for the
  // first lease of a sanitizer build on a loaded machine (300 ms was not:
  // CI at 6956409, under ASan).
  short_wait.request_timeout_ms = 2000;
  std::unique_ptr<Client> client_a;
  ASSERT_TRUE(Client::Connect(short_wait, &client_a).ok());
  std::unique_ptr<Cache> a;
  ASSERT_TRUE(client_a->OpenCache(CacheNamed(session, "c", 0, false), &a).ok());
  ASSERT_EQ(PutRange(a.get(), 0, 1, 1), 0);  // leases a 4 MB chunk

  // A row too big for the chunk's rest: a new lease, trading the old chunk
  // in, sent to a stopped daemon and given up on.
  std::vector<uint8_t> big(5u << 20, 7);
  const ContinuedAfter continued(server.pid());  // however the test ends
  ASSERT_TRUE(StopProcess(server.pid()));
  Status s = a->Put(1, big.data(), big.size());
  ASSERT_EQ(kill(server.pid(), SIGCONT), 0);
  ASSERT_TRUE(s.IsUnavailable()) << s.ToString();
  // The daemon answered the lease into a closed connection, then saw it end.
  const std::string settled = "process " + std::to_string(getpid()) + " ended";
  ASSERT_TRUE(WaitFor([&] { return ReadLogs(server).find(settled) != std::string::npos; },
                      std::chrono::seconds(60)))
      << ReadLogs(server);

  // B takes a chunk, then A puts more rows: each keeps to its own bytes.
  std::unique_ptr<Client> client_b;
  ASSERT_TRUE(server.Connect(&client_b).ok());
  std::unique_ptr<Cache> b;
  ASSERT_TRUE(client_b->OpenCache(CacheNamed(session, "c", 0, false), &b).ok());
  ASSERT_EQ(PutRange(b.get(), 100, 20, 2), 0);
  ASSERT_EQ(PutRange(a.get(), 2, 20, 1), 0);
  Row row;
  for (uint64_t i : std::vector<uint64_t>{0, 2, 10, 21, 100, 110, 119}) {
    Status got = b->Get(i, &row);
    ASSERT_TRUE(got.ok()) << "row " << i << ": " << got.ToString();
    auto col = row.find("data");
    ASSERT_TRUE(col.has_value());
    std::vector<uint8_t> want = Pattern(i, i < 100 ? 1 : 2, kRowBytes);
    ASSERT_EQ(0, std::memcmp(col->data, want.data(), kRowBytes)) << "row " << i;
  }
}

}  // namespace
}  // namespace shmcache::test
