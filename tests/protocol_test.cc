#include "format/protocol.h"

#include <array>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "format/protocol_messages.h"
#include "tests/protocol_samples.h"

namespace shmcache::protocol {
namespace {

std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::array<std::byte, kFrameHeaderBytes> Encode(const FrameHeader& h) {
  std::array<std::byte, kFrameHeaderBytes> b;
  EncodeFrameHeader(h, b.data());
  return b;
}

TEST(FrameHeaderTest, RoundTrip) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(MsgType::kOpenCache) | kResponseBit;
  h.body_len = 1234;
  auto b = Encode(h);
  FrameHeader out;
  ASSERT_TRUE(DecodeFrameHeader(b, &out).ok());
  EXPECT_EQ(out.magic, kFrameMagic);
  EXPECT_EQ(out.version, kProtocolVersion);
  EXPECT_EQ(out.type, h.type);
  EXPECT_EQ(out.body_len, 1234u);
}

TEST(FrameHeaderTest, IsLittleEndianOnTheWire) {
  FrameHeader h;
  h.type = 5;
  h.body_len = 0x01020304;
  auto b = Encode(h);
  EXPECT_EQ(b[0], std::byte{0x53});  // 'S' of "SMCP" magic, low byte first
  EXPECT_EQ(b[6], std::byte{5});
  EXPECT_EQ(b[8], std::byte{4});
  EXPECT_EQ(b[11], std::byte{1});
}

TEST(FrameHeaderTest, TruncatedHeaderIsCorruption) {
  auto b = Encode(FrameHeader{.type = 1});
  FrameHeader out;
  for (size_t n = 0; n < kFrameHeaderBytes; ++n) {
    EXPECT_TRUE(DecodeFrameHeader(std::span(b.data(), n), &out).IsCorruption()) << n;
  }
}

TEST(FrameHeaderTest, BadMagicIsCorruption) {
  FrameHeader h{.type = 1};
  h.magic = 0x12345678;
  FrameHeader out;
  Status s = DecodeFrameHeader(Encode(h), &out);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s.ToString();
}

TEST(FrameHeaderTest, OtherVersionIsNotSupportedAndSaysWhy) {
  FrameHeader h{.type = 1};
  h.version = kProtocolVersion + 1;
  FrameHeader out;
  Status s = DecodeFrameHeader(Encode(h), &out);
  EXPECT_EQ(s.code(), Status::Code::kNotSupported);
  EXPECT_NE(s.message().find("version"), std::string::npos) << s.ToString();
}

TEST(FrameHeaderTest, UnknownTypesAreCorruption) {
  FrameHeader out;
  for (uint16_t t : {uint16_t{0}, uint16_t{kMaxMsgType + 1}, uint16_t{0x7fff},
                     kResponseBit, uint16_t(kResponseBit | (kMaxMsgType + 1))}) {
    FrameHeader h{.type = t};
    EXPECT_TRUE(DecodeFrameHeader(Encode(h), &out).IsCorruption()) << t;
  }
  for (uint16_t t = 1; t <= kMaxMsgType; ++t) {
    FrameHeader h{.type = t};
    EXPECT_TRUE(DecodeFrameHeader(Encode(h), &out).ok()) << t;
    h.type = t | kResponseBit;
    EXPECT_TRUE(DecodeFrameHeader(Encode(h), &out).ok()) << t;
  }
}

TEST(FrameHeaderTest, OversizedBodyIsCorruption) {
  FrameHeader out;
  FrameHeader h{.type = 1, .body_len = kMaxBodyBytes};
  EXPECT_TRUE(DecodeFrameHeader(Encode(h), &out).ok());
  h.body_len = kMaxBodyBytes + 1;
  EXPECT_TRUE(DecodeFrameHeader(Encode(h), &out).IsCorruption());
  h.body_len = std::numeric_limits<uint32_t>::max();
  EXPECT_TRUE(DecodeFrameHeader(Encode(h), &out).IsCorruption());
}

TEST(WireTest, FieldsRoundTrip) {
  WireWriter w;
  w.U8(0xab);
  w.U16(0xbeef);
  w.U32(0xdeadbeef);
  w.U64(0x0123456789abcdefULL);
  w.Str("hello");
  w.Str("");
  std::string blob = std::string("a\0b", 3);
  w.Bytes(AsBytes(blob));
  WireReader r(AsBytes(w.body()));
  EXPECT_EQ(r.U8(), 0xab);
  EXPECT_EQ(r.U16(), 0xbeef);
  EXPECT_EQ(r.U32(), 0xdeadbeefu);
  EXPECT_EQ(r.U64(), 0x0123456789abcdefULL);
  EXPECT_EQ(r.Str(), "hello");
  EXPECT_EQ(r.Str(), "");
  auto b = r.Bytes();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(std::memcmp(b.data(), blob.data(), 3), 0);
  EXPECT_TRUE(r.Done());
}

TEST(WireTest, ReadingPastTheEndFailsAndStaysFailed) {
  WireWriter w;
  w.U32(7);
  WireReader r(AsBytes(w.body()));
  EXPECT_EQ(r.U64(), 0u);  // 4 bytes left, 8 wanted
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.U8(), 0u);  // would fit, but the reader already failed
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.Done());
}

TEST(WireTest, EveryTruncationOfABodyFails) {
  WireWriter w;
  w.U32(1);
  w.Str("name");
  w.U64(9);
  const std::string& full = w.body();
  for (size_t n = 0; n < full.size(); ++n) {
    std::string cut = full.substr(0, n);
    WireReader r(AsBytes(cut));
    r.U32();
    r.Str();
    r.U64();
    EXPECT_FALSE(r.ok()) << n;
  }
}

TEST(WireTest, StringLengthBeyondTheBodyFails) {
  WireWriter w;
  w.U32(1000);  // claims 1000 bytes
  w.Put("abc", 3);
  WireReader r(AsBytes(w.body()));
  EXPECT_EQ(r.Str(), "");
  EXPECT_FALSE(r.ok());
}

TEST(WireTest, HugeLengthDoesNotOverflow) {
  WireWriter w;
  w.U32(0xffffffffu);
  WireReader r(AsBytes(w.body()));
  EXPECT_TRUE(r.Bytes(std::numeric_limits<size_t>::max()).empty());
  EXPECT_FALSE(r.ok());
}

TEST(WireTest, StringLongerThanItsMaximumFails) {
  WireWriter w;
  w.Str(std::string(300, 'x'));
  {
    WireReader r(AsBytes(w.body()));
    EXPECT_EQ(r.Str(255), "");
    EXPECT_FALSE(r.ok());
  }
  {
    WireReader r(AsBytes(w.body()));
    EXPECT_EQ(r.Str(300).size(), 300u);
    EXPECT_TRUE(r.Done());
  }
  WireWriter big;
  big.Str(std::string(kMaxStringBytes + 1, 'y'));
  WireReader r(AsBytes(big.body()));
  r.Str();  // default maximum
  EXPECT_FALSE(r.ok());
}

TEST(WireTest, LeftoverBytesAreNotDone) {
  WireWriter w;
  w.U32(1);
  w.U8(2);
  WireReader r(AsBytes(w.body()));
  r.U32();
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(r.Done());
}

TEST(WireTest, StatusRoundTripAndBadCode) {
  WireWriter w;
  WriteStatus(w, Status::FingerprintMismatch("other pipeline"));
  WireReader r(AsBytes(w.body()));
  Status s = ReadStatus(r);
  EXPECT_TRUE(s.IsFingerprintMismatch());
  EXPECT_EQ(s.message(), "other pipeline");

  WireWriter bad;
  bad.U8(200);
  bad.U8(0);
  bad.Str("x");
  WireReader rb(AsBytes(bad.body()));
  EXPECT_TRUE(ReadStatus(rb).IsCorruption());

  WireReader empty({});
  EXPECT_TRUE(ReadStatus(empty).IsCorruption());
}

TEST(WireTest, StatusSubcodesTravel) {
  for (const Status& sent :
       {Status::FullNoShmRoom("no room"), Status::FullServerCap("cap"),
        Status::Full("budget"), Status::ColumnNotFound("col")}) {
    WireWriter w;
    WriteStatus(w, sent);
    WireReader r(AsBytes(w.body()));
    Status got = ReadStatus(r);
    EXPECT_EQ(got, sent) << sent.ToString();
  }
  WireWriter w;
  WriteStatus(w, Status::FullServerCap("cap"));
  WireReader r(AsBytes(w.body()));
  Status got = ReadStatus(r);
  EXPECT_TRUE(got.IsFull());
  EXPECT_TRUE(got.IsFullServerCap());
  EXPECT_FALSE(got.IsFullNoShmRoom());

  WireWriter bad;
  bad.U8(static_cast<uint8_t>(Status::Code::kFull));
  bad.U8(static_cast<uint8_t>(Status::SubCode::kLast) + 1);
  bad.Str("x");
  WireReader rb(AsBytes(bad.body()));
  EXPECT_TRUE(ReadStatus(rb).IsCorruption());
}

// (Every truncation: protocol_messages_test.cc.)
TEST(WireTest, SessionsRoundTrip) {
  const std::string body = EncodeBody(samples::Sample<ListSessionsResponse>());
  ListSessionsResponse listed;
  ASSERT_TRUE(DecodeBody(AsBytes(body), &listed));
  const std::vector<SessionInfo>& out = listed.sessions;
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].session_id, 22u);
  EXPECT_TRUE(out[1].caches.empty());
  ASSERT_EQ(out[0].caches.size(), 1u);
  const CacheStats& o = out[0].caches[0];
  EXPECT_EQ(o.session_id, 11u) << "from the session around it";
  EXPECT_EQ(o.cache_id, 3u);
  EXPECT_EQ(o.name, "train");
  EXPECT_EQ(o.mem_rows, 10u);
  EXPECT_EQ(o.mem_bytes, 30720u);
  EXPECT_EQ(o.avg_row_bytes(), 3072u);
  EXPECT_EQ(o.disk_rows, 1u);
  EXPECT_EQ(o.disk_bytes, 100u);
  EXPECT_EQ(o.hits, 5u);
  EXPECT_EQ(o.misses, 6u);
  EXPECT_EQ(o.numa_hits, 4u);
  EXPECT_EQ(o.reserved_bytes, 1u << 22);
  EXPECT_EQ(o.budget_bytes, 1u << 23);
  EXPECT_EQ(o.puts_full, 2u);
  EXPECT_EQ(o.spill_reads, 9u);
  EXPECT_TRUE(o.full);
  EXPECT_TRUE(o.spills_now);
}

TEST(WireTest, SessionCountBeyondLimitIsRefused) {
  WireWriter w;
  w.U32(0xffffffffu);
  ListSessionsResponse out;
  EXPECT_FALSE(DecodeBody(AsBytes(w.body()), &out));
}

TEST(WireTest, ServerInfoRoundTrip) {
  const ServerInfo in = samples::Sample<ServerInfoResponse>().info;
  ServerInfoResponse decoded;
  ASSERT_TRUE(DecodeBody(AsBytes(EncodeBody(ServerInfoResponse{.info = in})), &decoded));
  const ServerInfo& out = decoded.info;
  EXPECT_EQ(out.instance, in.instance);
  EXPECT_EQ(out.port, in.port);
  EXPECT_EQ(out.socket_path, in.socket_path);
  EXPECT_EQ(out.shm_dir, in.shm_dir);
  EXPECT_EQ(out.shm_huge_pages, in.shm_huge_pages);
  EXPECT_EQ(out.shm_pages, in.shm_pages);
  EXPECT_EQ(out.pid, in.pid);
  EXPECT_EQ(out.workers, in.workers);
  EXPECT_EQ(out.log_level, in.log_level);
  EXPECT_EQ(out.log_path, in.log_path);
  EXPECT_EQ(out.spill_dir, in.spill_dir);
  EXPECT_EQ(out.memory_cap_bytes, in.memory_cap_bytes);
  EXPECT_EQ(out.memory_used_bytes, in.memory_used_bytes);
  EXPECT_EQ(out.memory_held_bytes, in.memory_held_bytes);
  EXPECT_EQ(out.memory_requested_bytes, in.memory_requested_bytes);
  EXPECT_EQ(out.memory_requested_bound, in.memory_requested_bound);
  EXPECT_EQ(out.memory_cgroup_bytes, in.memory_cgroup_bytes);
  EXPECT_EQ(out.memory_cgroup_limit_bytes, in.memory_cgroup_limit_bytes);
  EXPECT_EQ(out.memory_shm_bytes, in.memory_shm_bytes);
  EXPECT_EQ(out.memory_cap_bound, in.memory_cap_bound);
  EXPECT_EQ(out.numa_nodes, 2);
  EXPECT_EQ(out.sessions, in.sessions);
  EXPECT_EQ(out.connections, in.connections);
  EXPECT_EQ(out.start_time_unix, in.start_time_unix);
  EXPECT_EQ(out.uptime_seconds, 1.5) << "in whole milliseconds";
}

}  // namespace
}  // namespace shmcache::protocol
