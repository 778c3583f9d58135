// The daemon's request handling without sockets: well-formed requests do
// what they say, and any malformed body is answered with Corruption (never
// a crash, never a half-done change).
#include "request_handler.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "logger.h"
#include "test_server.h"

namespace shmcache {
namespace {

using protocol::MsgType;
using protocol::WireReader;
using protocol::WireWriter;

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
    last_ = handler_->Handle(1, type,
                             {reinterpret_cast<const std::byte*>(body.data()), body.size()},
                             stop ? stop : &s);
    WireReader r({reinterpret_cast<const std::byte*>(last_.data()), last_.size()});
    return protocol::ReadStatus(r);
  }
  uint32_t NewSession() {
    bool stop = false;
    std::string resp = handler_->Handle(1, MsgType::kCreateSession, {}, &stop);
    WireReader r({reinterpret_cast<const std::byte*>(resp.data()), resp.size()});
    EXPECT_TRUE(protocol::ReadStatus(r).ok());
    uint32_t id = r.U32();
    EXPECT_TRUE(r.Done());
    return id;
  }
  std::string OpenCacheBody(uint32_t session, const std::string& name) {
    WireWriter w;
    w.U32(session);
    w.Str(name);
    w.Str(name + "-fp");
    w.U64(16);
    w.U8(0);
    return w.body();
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
  WireWriter w;
  w.U32(id);
  EXPECT_TRUE(Call(MsgType::kCheckSession, w.body()).ok());
  EXPECT_TRUE(Call(MsgType::kOpenCache, OpenCacheBody(id, "train")).ok());
  EXPECT_TRUE(Call(MsgType::kDestroySession, w.body()).ok());
  Status s = Call(MsgType::kCheckSession, w.body());
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_TRUE(Call(MsgType::kDestroySession, w.body()).IsNotFound());
  EXPECT_TRUE(Call(MsgType::kOpenCache, OpenCacheBody(id, "x")).IsNotFound());
}

TEST_F(RequestHandlerTest, StopIsReportedToTheServer) {
  bool stop = false;
  EXPECT_TRUE(Call(MsgType::kStop, "", &stop).ok());
  EXPECT_TRUE(stop);
  stop = false;
  EXPECT_TRUE(Call(MsgType::kStop, "x", &stop).IsCorruption());
  EXPECT_FALSE(stop) << "a malformed stop does not stop";
}

// Every well-formed body, cut short or extended by a byte, is refused.
TEST_F(RequestHandlerTest, MalformedBodiesAreCorruption) {
  uint32_t id = NewSession();
  ASSERT_TRUE(Call(MsgType::kOpenCache, OpenCacheBody(id, "train")).ok());
  WireWriter session;
  session.U32(id);
  WireWriter lease;
  lease.U32(1);
  lease.U32(0);
  lease.U64(4096);
  lease.U8(0);
  lease.U32(0);
  lease.U64(0);
  WireWriter ret;
  ret.U32(1);
  ret.U32(0);
  ret.U64(4096);
  WireWriter grow;
  grow.U32(1);
  grow.U32(5);
  WireWriter hello;
  hello.U32(1234);
  struct Case {
    MsgType type;
    std::string body;
  };
  const std::vector<Case> cases = {
      {MsgType::kHello, hello.body()},
      {MsgType::kCreateSession, ""},
      {MsgType::kCheckSession, session.body()},
      {MsgType::kOpenCache, OpenCacheBody(id, "train")},
      {MsgType::kLeaseChunk, lease.body()},
      {MsgType::kReturnChunk, ret.body()},
      {MsgType::kGrowIndex, grow.body()},
      {MsgType::kListSessions, ""},
      {MsgType::kServerInfo, ""},
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
  std::string body = OpenCacheBody(id, "train");
  body.back() = 2;  // spilling flag must be 0 or 1
  EXPECT_TRUE(Call(MsgType::kOpenCache, body).IsCorruption());
  WireWriter huge_name;
  huge_name.U32(id);
  huge_name.Str(std::string(300, 'n'));
  huge_name.Str("fp");
  huge_name.U64(16);
  huge_name.U8(0);
  EXPECT_FALSE(Call(MsgType::kOpenCache, huge_name.body()).ok());
  ASSERT_TRUE(Call(MsgType::kOpenCache, OpenCacheBody(id, "train")).ok());
  for (uint64_t need : {uint64_t{0}, uint64_t{1} << 40}) {
    WireWriter lease;
    lease.U32(1);
    lease.U32(0);
    lease.U64(need);
    lease.U8(0);
    lease.U32(0);
    lease.U64(0);
    EXPECT_FALSE(Call(MsgType::kLeaseChunk, lease.body()).ok()) << need;
  }
  WireWriter no_cache;
  no_cache.U32(999);
  no_cache.U32(0);
  no_cache.U64(4096);
  no_cache.U8(0);
  no_cache.U32(0);
  no_cache.U64(0);
  EXPECT_TRUE(Call(MsgType::kLeaseChunk, no_cache.body()).IsNotFound());
}

TEST_F(RequestHandlerTest, SpilledRowOverTheLimitIsRefusedBeforeDecoding) {
  // A client that skipped its own check: the row is refused by size, with
  // both sizes named, and the answer is an ordinary response.
  WireWriter w;
  w.U32(1);
  w.U64(5);
  w.Str(std::string(protocol::kMaxSpilledRowBytes + 8, '\0'));
  Status s = Call(MsgType::kSpillPut, w.body());
  EXPECT_TRUE(s.IsTooLarge()) << s.ToString();
  EXPECT_NE(s.message().find("row 5 is not cached"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::to_string(protocol::kMaxSpilledRowBytes)),
            std::string::npos) << s.message();
}

// A client that skips the library must not plant a name that breaks the
// listings (JSON, Python str): the daemon checks names itself.
TEST_F(RequestHandlerTest, NamesThatAreNotUtf8AreRefused) {
  uint32_t id = NewSession();
  for (std::string bad : {"\xff", "ok\xc3", "\xed\xa0\x80", "\xc0\xaf"}) {
    Status s = Call(MsgType::kOpenCache, OpenCacheBody(id, bad));
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    EXPECT_NE(s.message().find("UTF-8"), std::string::npos) << s.message();
  }
  WireWriter bad_fp;
  bad_fp.U32(id);
  bad_fp.Str("train");
  bad_fp.Str("fp-\xfe");
  bad_fp.U64(16);
  bad_fp.U8(0);
  EXPECT_TRUE(Call(MsgType::kOpenCache, bad_fp.body()).IsInvalidArgument());
  EXPECT_TRUE(Call(MsgType::kOpenCache, OpenCacheBody(id, "caf\xc3\xa9")).ok());
  std::vector<SessionInfo> sessions;
  store_->ListSessions(&sessions);
  ASSERT_EQ(sessions.size(), 1u);
  ASSERT_EQ(sessions[0].caches.size(), 1u);
  EXPECT_EQ(sessions[0].caches[0].name, "caf\xc3\xa9");
}

}  // namespace
}  // namespace shmcache
