// Every control message: its bytes on the wire (pinned: they are those the
// hand-written encoders of protocol version 3 produced), the round trip
// through Encode and Decode, and Decode's refusal of bodies that are cut
// short, too long, out of range or random.
#include "format/protocol_messages.h"

#include <random>
#include <string>
#include <type_traits>

#include <gtest/gtest.h>

#include "tests/protocol_samples.h"

namespace shmcache::protocol {
namespace {

using samples::Sample;

std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string Hex(const std::string& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

// The body of each sample as the encoders before the message structs wrote it.
template <typename M>
const char* Golden();
template <>
const char* Golden<NoPayload>() {
  return "";
}
template <>
const char* Golden<HelloRequest>() {
  return "92100000";
}
template <>
const char* Golden<HelloResponse>() {
  return "070000001a0000002f6465762f73686d2f73686d63616368652e302e35303035322e";
}
template <>
const char* Golden<CreateSessionRequest>() {
  return "";
}
template <>
const char* Golden<CreateSessionResponse>() {
  return "04030201";
}
template <>
const char* Golden<DestroySessionRequest>() {
  return "0b000000";
}
template <>
const char* Golden<CheckSessionRequest>() {
  return "0c000000";
}
template <>
const char* Golden<OpenCacheRequest>() {
  return "0b00000005000000747261696e0400000066702d31100000000000000001";
}
template <>
const char* Golden<OpenCacheResponse>() {
  return "03000000";
}
template <>
const char* Golden<LeaseChunkRequest>() {
  return "0300000001000000a00f00000000000001020000000020000000000000";
}
template <>
const char* Golden<LeaseChunkResponse>() {
  return "0200000000100000000000000000400000000000";
}
template <>
const char* Golden<ReturnChunkRequest>() {
  return "03000000020000000020000000000000";
}
template <>
const char* Golden<GrowIndexRequest>() {
  return "0300000001000000";
}
template <>
const char* Golden<ListSessionsRequest>() {
  return "";
}
template <>
const char* Golden<ListSessionsResponse>() {
  return "020000000b000000010000000300000005000000747261696e0a00000000000000007800"
         "000000000001000000000000000500000000000000060000000000000004000000000000"
         "000000400000000000000080000000000001640000000000000002000000000000000900"
         "000000000000011600000000000000";
}
template <>
const char* Golden<ServerInfoRequest>() {
  return "";
}
template <>
const char* Golden<ServerInfoResponse>() {
  return "0a000000706f727420353030353284c300000b0000002f746d702f782e736f636b080000"
         "002f6465762f73686d2a0000000400000002000000080000002f746d702f6c6f67060000"
         "002f7370696c6c00000000000100003930000000000000a6020000000000000200000003"
         "000000010000000200000003000000050000000000000000f1536500000000dc05000000"
         "000000010000001e000000746d706673206d6f756e74656420687567653d77697468696e"
         "5f73697a6500000000000200000f000000706879736963616c5f6d656d6f7279000000"
         "c000000000000000000100000000000000000100000e00000073686d5f66696c657379"
         "7374656d";
}
template <>
const char* Golden<StopRequest>() {
  return "";
}
template <>
const char* Golden<SpillPutRequest>() {
  return "03000000050000000000000003000000726f77";
}
template <>
const char* Golden<SpillPutResponse>() {
  return "01";
}
template <>
const char* Golden<SpillGetRequest>() {
  return "0300000003000000050000000000000006000000000000000700000000000000";
}
template <>
const char* Golden<SpillGetResponse>() {
  return "030000000104000000726f77350002";
}

// Protocol version 6's.
template <>
const char* Golden<SpillStageRequest>() {
  return "030000000010000000000000";
}
template <>
const char* Golden<SpillStageResponse>() {
  return "0d0c0b0a0000800000000000";
}
template <>
const char* Golden<SpillPutStagedRequest>() {
  return "030000000d0c0b0a02000000050000000000000006000000000000001800000020000000";
}
template <>
const char* Golden<SpillPutStagedResponse>() {
  return "020000000100";
}

template <typename M>
class MessageTest : public ::testing::Test {};

using AllMessages = ::testing::Types<
    NoPayload, HelloRequest, HelloResponse, CreateSessionRequest, CreateSessionResponse,
    DestroySessionRequest, CheckSessionRequest, OpenCacheRequest, OpenCacheResponse,
    LeaseChunkRequest, LeaseChunkResponse, ReturnChunkRequest, GrowIndexRequest,
    ListSessionsRequest, ListSessionsResponse, ServerInfoRequest, ServerInfoResponse,
    StopRequest, SpillPutRequest, SpillPutResponse, SpillGetRequest, SpillGetResponse,
    SpillStageRequest, SpillStageResponse, SpillPutStagedRequest, SpillPutStagedResponse>;
TYPED_TEST_SUITE(MessageTest, AllMessages);

TYPED_TEST(MessageTest, EncodesTheBytesOfProtocolVersion4) {
  EXPECT_EQ(Hex(EncodeBody(Sample<TypeParam>())), Golden<TypeParam>());
}

TYPED_TEST(MessageTest, RoundTrips) {
  const std::string body = EncodeBody(Sample<TypeParam>());
  TypeParam decoded;
  ASSERT_TRUE(DecodeBody(AsBytes(body), &decoded));
  EXPECT_EQ(Hex(EncodeBody(decoded)), Hex(body));
}

TYPED_TEST(MessageTest, EveryTruncationAndAnyExtraByteIsRefused) {
  const std::string body = EncodeBody(Sample<TypeParam>());
  for (size_t n = 0; n < body.size(); ++n) {
    std::string cut = body.substr(0, n);
    TypeParam decoded;
    EXPECT_FALSE(DecodeBody(AsBytes(cut), &decoded)) << n;
  }
  std::string longer = body + '\0';
  TypeParam decoded;
  EXPECT_FALSE(DecodeBody(AsBytes(longer), &decoded));
}

// Random bodies never decode into something that encodes differently: what
// Decode accepts is exactly a body Encode writes. (Responses carry the
// uptime as a double, not re-encoded bit for bit: they must decode again.)
TYPED_TEST(MessageTest, RandomBodiesAreRefusedOrReadExactly) {
  std::mt19937_64 rng(7);
  const std::string sample = EncodeBody(Sample<TypeParam>());
  for (int i = 0; i < 4000; ++i) {
    // Random bytes, or the sample with a few bytes changed (deep fields).
    std::string body = sample;
    if (i % 2 == 0) {
      body.resize(rng() % 48);
      for (char& c : body) c = static_cast<char>(rng());
    } else if (!body.empty()) {
      for (int k = 0; k < 3; ++k) body[rng() % body.size()] = static_cast<char>(rng());
    }
    TypeParam decoded;
    if (!DecodeBody(AsBytes(body), &decoded)) continue;
    const std::string again = EncodeBody(decoded);
    if constexpr (std::is_same_v<TypeParam, ServerInfoResponse>) {
      TypeParam twice;
      EXPECT_TRUE(DecodeBody(AsBytes(again), &twice)) << Hex(body);
    } else {
      EXPECT_EQ(Hex(again), Hex(body));
    }
  }
}

// (Listings and server info: protocol_test.cc.)
TEST(MessagesTest, SpilledRowsAreViewsOfTheBody) {
  SpillGetResponse got;
  const std::string body = EncodeBody(Sample<SpillGetResponse>());
  ASSERT_TRUE(DecodeBody(AsBytes(body), &got));
  ASSERT_EQ(got.answers.size(), 3u);
  EXPECT_EQ(got.answers[0].mark, kSpillFound);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.answers[0].row.data()),
                        got.answers[0].row.size()),
            "row5");
  EXPECT_EQ(got.answers[1].mark, kSpillAbsent);
  EXPECT_EQ(got.answers[2].mark, kSpillAskAgain);
}

TEST(MessagesTest, ARowWhoseReadFailedCarriesTheErrorAndTheOthersTheirRows) {
  SpillGetResponse sent;
  const std::string error = "spill store: Corruption: block checksum mismatch";
  const std::string row = "row6";
  sent.answers = {{kSpillFailed, std::as_bytes(std::span(error))},
                  {kSpillFound, std::as_bytes(std::span(row))}};
  const std::string body = EncodeBody(sent);
  SpillGetResponse got;
  ASSERT_TRUE(DecodeBody(AsBytes(body), &got));
  ASSERT_EQ(got.answers.size(), 2u);
  EXPECT_EQ(got.answers[0].mark, kSpillFailed);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.answers[0].row.data()),
                        got.answers[0].row.size()),
            error);
  EXPECT_EQ(got.answers[1].mark, kSpillFound);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.answers[1].row.data()),
                        got.answers[1].row.size()),
            row);
}

// Decodes `body` as M after `edit` changed it.
template <typename M, typename Edit>
bool DecodesAfter(M m, Edit edit) {
  edit(&m);
  std::string body = EncodeBody(m);
  M out;
  return DecodeBody(AsBytes(body), &out);
}

TEST(MessagesTest, FieldsOutOfTheirRangeAreRefused) {
  auto lease = Sample<LeaseChunkRequest>();
  EXPECT_FALSE(DecodesAfter(lease, [](auto* m) { m->need = 0; }));
  EXPECT_FALSE(DecodesAfter(lease, [](auto* m) { m->need = kMaxLeaseBytes + 1; }));
  EXPECT_TRUE(DecodesAfter(lease, [](auto* m) { m->need = kMaxLeaseBytes; }));
  EXPECT_FALSE(DecodesAfter(
      lease, [](auto* m) { m->node = LeaseChunkRequest::kMaxLeaseNode + 1; }));
  auto open = Sample<OpenCacheRequest>();
  EXPECT_FALSE(DecodesAfter(open, [](auto* m) { m->name = std::string(256, 'n'); }));
  EXPECT_TRUE(DecodesAfter(open, [](auto* m) { m->name = std::string(255, 'n'); }));
  EXPECT_FALSE(
      DecodesAfter(open, [](auto* m) { m->fingerprint = std::string(256, 'f'); }));
  auto get = Sample<SpillGetRequest>();
  EXPECT_FALSE(DecodesAfter(get, [](auto* m) { m->ids.clear(); }));
  EXPECT_FALSE(DecodesAfter(get, [](auto* m) { m->ids.assign(kMaxSpillBatch + 1, 1); }));
  EXPECT_TRUE(DecodesAfter(get, [](auto* m) { m->ids.assign(kMaxSpillBatch, 1); }));
  auto answer = Sample<SpillGetResponse>();
  EXPECT_FALSE(
      DecodesAfter(answer, [](auto* m) { m->answers[1].mark = kSpillFailed + 1; }));
  EXPECT_FALSE(DecodesAfter(answer, [](auto* m) {  // nothing found after "ask again"
    m->answers[1].mark = kSpillAskAgain;
    m->answers[2].mark = kSpillAbsent;
  }));
}

// A flag is one byte, 0 or 1: the last byte of each of these bodies.
TEST(MessagesTest, FlagsOtherThanZeroOrOneAreRefused) {
  auto with_last_byte = [](std::string body, char c) {
    body.back() = c;
    return body;
  };
  const std::string open = EncodeBody(Sample<OpenCacheRequest>());
  const std::string put = EncodeBody(Sample<SpillPutResponse>());
  const std::string listed = EncodeBody(Sample<ListSessionsResponse>());
  OpenCacheRequest o;
  SpillPutResponse p;
  ListSessionsResponse l;
  EXPECT_TRUE(DecodeBody(AsBytes(with_last_byte(open, 0)), &o));
  EXPECT_FALSE(DecodeBody(AsBytes(with_last_byte(open, 2)), &o));
  EXPECT_FALSE(DecodeBody(AsBytes(with_last_byte(put, 2)), &p));
  // The listing ends with an empty session: its cache count.
  std::string spilling_2 = listed;
  spilling_2[spilling_2.size() - 9] = 2;  // the cache's spilling flag
  EXPECT_FALSE(DecodeBody(AsBytes(spilling_2), &l));
}

TEST(MessagesTest, SpillAnswersBeyondTheBatchLimitAreRefused) {
  // (Listings: protocol_test.cc.)
  WireWriter w;
  w.U32(0xffffffffu);
  SpillGetResponse g;
  EXPECT_FALSE(DecodeBody(AsBytes(w.body()), &g));
}

}  // namespace
}  // namespace shmcache::protocol
