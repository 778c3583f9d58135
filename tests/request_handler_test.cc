// The daemon's request handling without sockets: well-formed requests do
// what they say, and any malformed body is answered with Corruption (never
// a crash, never a half-done change).
#include "daemon/request_handler.h"

#include <dirent.h>
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/logger.h"
#include "format/protocol_messages.h"
#include "tests/support/test_server.h"
#include "tests/support/wait_for.h"

namespace shmcache {
namespace {
// Set: a scan of /proc (FindMappedDeleted) waits, at most 10 s, until a
// destroy has returned; scan_outlasted is set when it has not by then.
std::atomic<bool> hold_proc_scans{false}, destroy_returned{false}, scan_outlasted{false};
}  // namespace
}  // namespace shmcache

// The interposed opendir (this binary's definition wins over libc's).
extern "C" DIR* opendir(const char* name) {
  using shmcache::destroy_returned, shmcache::hold_proc_scans, shmcache::scan_outlasted;
  if (hold_proc_scans.load() && std::strcmp(name, "/proc") == 0 &&
      !shmcache::test::WaitFor([] { return destroy_returned.load(); },
                               std::chrono::seconds(10))) {
    scan_outlasted.store(true);
  }
  static auto* real =
      reinterpret_cast<DIR* (*)(const char*)>(dlsym(RTLD_NEXT, "opendir"));
  return real(name);
}

namespace shmcache {
namespace {

namespace pr = protocol;
using protocol::EncodeBody;
using protocol::MsgType;
using protocol::WireReader;

class RequestHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shm_dir_ = test::MakeTempDir("/dev/shm", "shmcache-rh");
    run_dir_ = test::MakeTempDir(test::TestTmpRoot(), "rh");
    ASSERT_TRUE(log_.Open(run_dir_ + "/log", 4).ok());
    DaemonOptions o;
    o.memory_cap_bytes = 256u << 20;
    paths_ = MakeInstancePaths(40002, run_dir_, shm_dir_);
    store_ = std::make_unique<Store>(o, paths_, 1, 1, &log_);
    ASSERT_TRUE(store_->Init().ok());
    handler_ = std::make_unique<RequestHandler>(store_.get());
  }
  void TearDown() override {
    handler_.reset();
    store_->Shutdown();
    store_.reset();
    EXPECT_TRUE(test::ListDir(shm_dir_).empty())
        << testing::PrintToString(test::ListDir(shm_dir_));
    test::RemoveTree(shm_dir_);
    test::RemoveTree(run_dir_);
  }
  // Sends a request; returns the status its response starts with.
  Status Call(MsgType type, const std::string& body, bool* stop = nullptr) {
    bool s = false;
    last_ = handler_->Handle(
        1, type, {reinterpret_cast<const std::byte*>(body.data()), body.size()},
        stop ? stop : &s);
    WireReader r({reinterpret_cast<const std::byte*>(last_.data()), last_.size()});
    return protocol::ReadStatus(r);
  }
  template <typename Request>
  Status Call(const Request& request, bool* stop = nullptr) {
    return Call(Request::kType, EncodeBody(request), stop);
  }
  uint32_t NewSession() {
    EXPECT_TRUE(Call(pr::CreateSessionRequest{}).ok());
    WireReader r({reinterpret_cast<const std::byte*>(last_.data()), last_.size()});
    EXPECT_TRUE(protocol::ReadStatus(r).ok());
    pr::CreateSessionResponse created;
    EXPECT_TRUE(pr::DecodeMessage(&r, &created));
    return created.session_id;
  }
  static pr::OpenCacheRequest OpenCache(uint32_t session, const std::string& name) {
    return {
        .session_id = session, .name = name, .fingerprint = name + "-fp", .size_mb = 16};
  }
  static pr::LeaseChunkRequest Lease(uint32_t cache_id, uint64_t need) {
    return {.cache_id = cache_id, .need = need};
  }

  std::string shm_dir_, run_dir_, last_;
  InstancePaths paths_;
  Logger log_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<RequestHandler> handler_;
};

TEST_F(RequestHandlerTest, SessionsLifecycle) {
  uint32_t id = NewSession();
  EXPECT_NE(id, 0u);
  EXPECT_TRUE(Call(pr::CheckSessionRequest{.session_id = id}).ok());
  EXPECT_TRUE(Call(OpenCache(id, "train")).ok());
  EXPECT_TRUE(Call(pr::DestroySessionRequest{.session_id = id}).ok());
  Status s = Call(pr::CheckSessionRequest{.session_id = id});
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_TRUE(Call(pr::DestroySessionRequest{.session_id = id}).IsNotFound());
  EXPECT_TRUE(Call(OpenCache(id, "x")).IsNotFound());
}

// The memory of a destroyed session is released once no process maps its
// files, which a scan of every process's maps tells: seconds on a busy
// host. A destroy does not wait for that scan (a client's request times
// out after 5 s): the segment preparer makes it.
TEST_F(RequestHandlerTest, ADestroyDoesNotWaitForTheScanOfMappedFiles) {
  const uint32_t id = NewSession();
  ASSERT_TRUE(Call(OpenCache(id, "train")).ok());
  WireReader r({reinterpret_cast<const std::byte*>(last_.data()), last_.size()});
  ASSERT_TRUE(protocol::ReadStatus(r).ok());
  pr::OpenCacheResponse opened;
  ASSERT_TRUE(pr::DecodeMessage(&r, &opened));
  ASSERT_TRUE(Call(Lease(opened.cache_id, 4096)).ok()) << "a segment to hold";
  hold_proc_scans.store(true);
  EXPECT_TRUE(Call(pr::DestroySessionRequest{.session_id = id}).ok());
  destroy_returned.store(true);
  EXPECT_FALSE(scan_outlasted.load()) << "the destroy waited for a scan of /proc";
  hold_proc_scans.store(false);
}

TEST_F(RequestHandlerTest, StopIsReportedToTheServer) {
  bool stop = false;
  EXPECT_TRUE(Call(MsgType::kStop, "", &stop).ok());
  EXPECT_TRUE(stop);
  stop = false;
  EXPECT_TRUE(Call(MsgType::kStop, "x", &stop).IsCorruption());
  EXPECT_FALSE(stop) << "a malformed stop does not stop";
}

// Every type a frame header accepts has its handler: none is declared and
// left unanswered.
TEST_F(RequestHandlerTest, EveryMessageTypeIsHandled) {
  for (uint16_t t = 1; t <= protocol::kMaxMsgType; ++t) {
    if (t == static_cast<uint16_t>(MsgType::kStop)) continue;
    Status s = Call(static_cast<MsgType>(t), "");
    EXPECT_FALSE(s.IsNotSupported()) << t << ": " << s.ToString();
  }
}

// Every well-formed body, cut short or extended by a byte, is refused.
TEST_F(RequestHandlerTest, MalformedBodiesAreCorruption) {
  uint32_t id = NewSession();
  ASSERT_TRUE(Call(OpenCache(id, "train")).ok());
  struct Case {
    MsgType type;
    std::string body;
  };
  auto of = [](const auto& request) {
    return Case{std::decay_t<decltype(request)>::kType, EncodeBody(request)};
  };
  const std::vector<Case> cases = {
      of(pr::HelloRequest{.pid = 1234}),
      of(pr::CreateSessionRequest{}),
      of(pr::CheckSessionRequest{.session_id = id}),
      of(OpenCache(id, "train")),
      of(Lease(1, 4096)),
      of(pr::ReturnChunkRequest{.cache_id = 1, .seg_no = 0, .offset = 4096}),
      of(pr::GrowIndexRequest{.cache_id = 1, .seen_tables = 5}),
      of(pr::ListSessionsRequest{}),
      of(pr::ServerInfoRequest{}),
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.type));
    for (size_t n = 0; n < c.body.size(); ++n) {
      Status s = Call(c.type, c.body.substr(0, n));
      EXPECT_TRUE(s.IsCorruption()) << n << ": " << s.ToString();
    }
    Status s = Call(c.type, c.body + "x");
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  }
  // Nothing was changed by the refused requests: one session, one cache.
  std::vector<SessionInfo> sessions;
  store_->ListSessions(&sessions);
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].caches.size(), 1u);
}

TEST_F(RequestHandlerTest, OutOfRangeFieldsAreRefused) {
  uint32_t id = NewSession();
  std::string body = EncodeBody(OpenCache(id, "train"));
  body.back() = 2;  // spilling flag must be 0 or 1
  EXPECT_TRUE(Call(MsgType::kOpenCache, body).IsCorruption());
  pr::OpenCacheRequest huge_name = OpenCache(id, "train");
  huge_name.name = std::string(300, 'n');
  EXPECT_FALSE(Call(huge_name).ok());
  ASSERT_TRUE(Call(OpenCache(id, "train")).ok());
  for (uint64_t need : {uint64_t{0}, uint64_t{1} << 40}) {
    EXPECT_FALSE(Call(Lease(1, need)).ok()) << need;
  }
  EXPECT_TRUE(Call(Lease(999, 4096)).IsNotFound());
}

TEST_F(RequestHandlerTest, SpilledRowOverTheLimitIsRefusedBeforeDecoding) {
  // A client that skipped its own check: the row is refused by size, with
  // both sizes named, and the answer is an ordinary response.
  const std::string row(protocol::kMaxSpilledRowBytes + 8, '\0');
  Status s = Call(pr::SpillPutRequest{
      .cache_id = 1, .row_id = 5, .row = std::as_bytes(std::span(row))});
  EXPECT_TRUE(s.IsTooLarge()) << s.ToString();
  EXPECT_NE(s.message().find("row 5 is not cached"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::to_string(protocol::kMaxSpilledRowBytes)),
            std::string::npos)
      << s.message();
}

// A client that skips the library must not plant a name that breaks the
// listings (JSON, Python str): the daemon checks names itself.
TEST_F(RequestHandlerTest, NamesThatAreNotUtf8AreRefused) {
  uint32_t id = NewSession();
  for (std::string bad : {"\xff", "ok\xc3", "\xed\xa0\x80", "\xc0\xaf"}) {
    Status s = Call(OpenCache(id, bad));
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    EXPECT_NE(s.message().find("UTF-8"), std::string::npos) << s.message();
  }
  pr::OpenCacheRequest bad_fp = OpenCache(id, "train");
  bad_fp.fingerprint = "fp-\xfe";
  EXPECT_TRUE(Call(bad_fp).IsInvalidArgument());
  EXPECT_TRUE(Call(OpenCache(id, "caf\xc3\xa9")).ok());
  std::vector<SessionInfo> sessions;
  store_->ListSessions(&sessions);
  ASSERT_EQ(sessions.size(), 1u);
  ASSERT_EQ(sessions[0].caches.size(), 1u);
  EXPECT_EQ(sessions[0].caches[0].name, "caf\xc3\xa9");
}

}  // namespace
}  // namespace shmcache
