// Client (client.h): connecting, opening a cache (fingerprints, names,
// sessions), and calls once the daemon is gone. A real daemon per
// IntegrationTest (integration_fixture.h); ClientTest needs none.
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/files.h"
#include "tests/support/integration_fixture.h"

namespace shmcache::test {
namespace {

TEST_F(IntegrationTest, OpeningWithAnotherFingerprintIsRefused) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  CacheOptions o = Options(session_);
  o.fingerprint = "another-pipeline";
  std::unique_ptr<Cache> other;
  Status s = client->OpenCache(o, &other);
  EXPECT_TRUE(s.IsFingerprintMismatch()) << s.ToString();
  // The same name and fingerprint is the same cache.
  std::unique_ptr<Cache> same = Open(*client, Options(session_));
  ASSERT_TRUE(same);
  EXPECT_EQ(same->cache_id(), cache->cache_id());
  // A session that does not exist is NotFound, naming it.
  s = client->OpenCache(Options(session_ + 1), &other);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_NE(s.message().find(std::to_string(session_ + 1)), std::string::npos);
}

// Names show up in listings and as Python str: the library refuses a name
// or fingerprint that is not UTF-8 itself, without asking the daemon (here
// gone, so asking would fail with Unavailable instead).
TEST_F(IntegrationTest, OpeningANameThatIsNotUtf8IsRefusedByTheLibrary) {
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server_->Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(Options(session_, "caf\xc3\xa9"), &cache);
  ASSERT_TRUE(s.ok()) << s.ToString();
  server_->Kill();
  for (std::string bad : {"\xff\xfe", "train\xe2\x82", "\xf4\x90\x80\x80"}) {
    std::unique_ptr<Cache> other;
    s = client->OpenCache(Options(session_, bad), &other);
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    EXPECT_NE(s.message().find("UTF-8"), std::string::npos) << s.message();
  }
  CacheOptions o = Options(session_);
  o.fingerprint = "pipeline-\x80";
  std::unique_ptr<Cache> other;
  EXPECT_TRUE(client->OpenCache(o, &other).IsInvalidArgument());
}

// When the daemon is gone, calls fail with Unavailable instead of crashing
// or hanging; rows already mapped may still be served.
TEST_F(IntegrationTest, UnavailableWhenTheDaemonIsGone) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 1, 0, kRowBytes).ok());
  server_->Kill();
  uint32_t id = 0;
  Status s = client->CreateSession(&id);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  std::vector<SessionInfo> sessions;
  EXPECT_TRUE(client->ListSessions(&sessions).IsUnavailable());
  // Puts that need a new chunk cannot get one.
  std::vector<uint8_t> big(8 << 20);
  s = cache->Put(2, big.data(), big.size());
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  Row row;
  s = cache->Get(1, &row);
  EXPECT_TRUE(s.ok() || s.IsUnavailable() || s.IsNotFound()) << s.ToString();
  // A new client is told the server is not running.
  std::unique_ptr<Client> other;
  s = server_->Connect(&other);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("not running"), std::string::npos) << s.ToString();
  cache->Close();
}

// A Cache may outlive the Client that opened it (client.h): it keeps the
// connection's state, and puts that lease chunks still reach the daemon.
TEST_F(IntegrationTest, ACacheOutlivesItsClient) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  client.reset();
  for (uint64_t id = 0; id < 200; ++id) {  // more than one chunk
    ASSERT_TRUE(PutPattern(*cache, id, 0, RowBytes(id)).ok()) << id;
  }
  Row row;
  ASSERT_TRUE(cache->Get(199, &row).ok());
  EXPECT_TRUE(RowMatches(row, 199, 0, RowBytes(199)));
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, 200u);
}

// After an error every out-parameter of a Client call is as it was
// (client.h, status.h).
TEST_F(IntegrationTest, AFailedClientCallLeavesItsOutputsAsTheyWere) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  Cache* const opened = cache.get();
  Status s = client->OpenCache(Options(session_ + 1), &cache);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_EQ(cache.get(), opened) << "OpenCache left *out as it was";
  server_->Kill();
  uint32_t id = 77;
  s = client->CreateSession(&id);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_EQ(id, 77u);
  std::vector<SessionInfo> sessions(1);
  sessions[0].session_id = 5;
  EXPECT_TRUE(client->ListSessions(&sessions).IsUnavailable());
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].session_id, 5u);
  ServerInfo info;
  info.pid = 1234;
  EXPECT_TRUE(client->GetServerInfo(&info).IsUnavailable());
  EXPECT_EQ(info.pid, 1234);
  s = client->OpenCache(Options(session_, "other"), &cache);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_EQ(cache.get(), opened);
  cache->Close();
}

TEST(ClientTest, ConnectWithoutADaemonIsUnavailable) {
  TempDir run_dir(TestTmpRoot());
  const std::string& run = run_dir.path();
  ClientOptions o;
  o.port = 30999;
  o.run_dir = run;
  std::unique_ptr<Client> client;
  Status s = Client::Connect(o, &client);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("30999"), std::string::npos) << s.ToString();
}

TEST(ClientTest, NonLocalHostAndBadPortAreInvalidArguments) {
  ClientOptions o;
  o.hostname = "10.1.2.3";
  std::unique_ptr<Client> client;
  Status s = Client::Connect(o, &client);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("10.1.2.3"), std::string::npos);
  ClientOptions p;
  p.port = 80;
  s = Client::Connect(p, &client);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("1025..65535"), std::string::npos) << s.ToString();
}

// A request timeout of 0 or less would be no timeout at all (the socket's
// SO_RCVTIMEO of 0 waits forever, a negative one is not set): a hung server
// would hold every call, Close() included. Connect refuses it, naming it.
TEST(ClientTest, ARequestTimeoutThatIsNotPositiveIsAnInvalidArgument) {
  for (int ms : {0, -1, -5000}) {
    ClientOptions o;
    o.request_timeout_ms = ms;
    std::unique_ptr<Client> client;
    Status s = Client::Connect(o, &client);
    EXPECT_TRUE(s.IsInvalidArgument()) << ms << ": " << s.ToString();
    EXPECT_NE(s.message().find("request_timeout_ms"), std::string::npos) << s.ToString();
    EXPECT_EQ(client, nullptr);
  }
}

// An empty $SHMCACHE_RUN_DIR is refused, naming it, as the admin and the
// daemon refuse it (and an empty $SHMCACHE_PORT): it was read as unset,
// and the trainer looked in the default run dir. An explicit run_dir
// stands whatever the variable holds.
TEST(ClientTest, AnEmptyRunDirVariableIsAnInvalidArgument) {
  const char* before = std::getenv("SHMCACHE_RUN_DIR");
  const std::string kept = before != nullptr ? before : "";
  setenv("SHMCACHE_RUN_DIR", "", 1);
  ClientOptions o;
  o.port = 30998;
  std::unique_ptr<Client> client;
  Status s = Client::Connect(o, &client);
  TempDir run_dir(TestTmpRoot());
  o.run_dir = run_dir.path();
  Status given = Client::Connect(o, &client);
  if (before != nullptr) {
    setenv("SHMCACHE_RUN_DIR", kept.c_str(), 1);
  } else {
    unsetenv("SHMCACHE_RUN_DIR");
  }
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("run dir '' (SHMCACHE_RUN_DIR) is not an absolute path (it "
                             "is empty)"),
            std::string::npos)
      << s.ToString();
  EXPECT_TRUE(given.IsUnavailable()) << given.ToString();
}

}  // namespace
}  // namespace shmcache::test
