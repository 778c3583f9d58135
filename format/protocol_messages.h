// Every message of the control protocol, defined once: one struct per
// request and per response, with its body's encoding (Encode) and its
// checked reading (Decode). The client encodes requests and decodes
// responses (ClientImpl::Call); the daemon decodes requests and encodes
// responses (RequestHandler); tests and fuzz targets use the same structs.
//
// Decode(r, out) reads one whole body: it returns true when every field was
// read within its bounds and no byte is left over; on false *out holds
// whatever was read and is not to be used. A response body's status
// (WriteStatus, protocol.h) comes before the message and is read first.
// Flags travel as one byte, 0 or 1; any other value is malformed.
//
// Every request names its frame type (kType), its response (Response) and a
// name for messages (kName); Requests lists them in type order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/protocol.h"
#include "shmcache/stats.h"

namespace shmcache::protocol {

// The response of requests that answer with their status alone.
struct NoPayload {
  void Encode(WireWriter*) const {}
  static bool Decode(WireReader* r, NoPayload* out);
};

struct HelloResponse {
  uint32_t client_id = 0;
  std::string shm_prefix;  // full path prefix of the instance's shm files
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, HelloResponse* out);
};

struct HelloRequest {
  static constexpr MsgType kType = MsgType::kHello;
  static constexpr const char* kName = "Hello";
  using Response = HelloResponse;
  uint32_t pid = 0;  // the client's, for the log
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, HelloRequest* out);
};

struct CreateSessionResponse {
  uint32_t session_id = 0;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, CreateSessionResponse* out);
};

struct CreateSessionRequest {
  static constexpr MsgType kType = MsgType::kCreateSession;
  static constexpr const char* kName = "CreateSession";
  using Response = CreateSessionResponse;
  void Encode(WireWriter*) const {}
  static bool Decode(WireReader* r, CreateSessionRequest* out);
};

struct DestroySessionRequest {
  static constexpr MsgType kType = MsgType::kDestroySession;
  static constexpr const char* kName = "DestroySession";
  using Response = NoPayload;
  uint32_t session_id = 0;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, DestroySessionRequest* out);
};

struct CheckSessionRequest {
  static constexpr MsgType kType = MsgType::kCheckSession;
  static constexpr const char* kName = "CheckSession";
  using Response = NoPayload;
  uint32_t session_id = 0;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, CheckSessionRequest* out);
};

struct OpenCacheResponse {
  uint32_t cache_id = 0;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, OpenCacheResponse* out);
};

// name and fingerprint: at most layout::kMaxNameBytes each.
struct OpenCacheRequest {
  static constexpr MsgType kType = MsgType::kOpenCache;
  static constexpr const char* kName = "OpenCache";
  using Response = OpenCacheResponse;
  uint32_t session_id = 0;
  std::string name;
  std::string fingerprint;
  uint64_t size_mb = 0;
  bool spilling = false;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, OpenCacheRequest* out);
};

struct LeaseChunkResponse {
  uint32_t seg_no = 0;
  uint64_t offset = 0;  // of the chunk inside its segment
  uint64_t size = 0;    // of the chunk, its header included
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, LeaseChunkResponse* out);
};

// need: 1..kMaxLeaseBytes; node: at most kMaxLeaseNode.
struct LeaseChunkRequest {
  static constexpr MsgType kType = MsgType::kLeaseChunk;
  static constexpr const char* kName = "LeaseChunk";
  using Response = LeaseChunkResponse;
  static constexpr uint32_t kMaxLeaseNode = 1024;
  uint32_t cache_id = 0;
  uint32_t node = 0;  // NUMA node the rows are written from
  uint64_t need = 0;  // bytes of row space
  // The chunk the client writes into now, whose unused tail it hands back
  // once the new lease is granted.
  bool has_old = false;
  uint32_t old_seg_no = 0;
  uint64_t old_offset = 0;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, LeaseChunkRequest* out);
};

struct ReturnChunkRequest {
  static constexpr MsgType kType = MsgType::kReturnChunk;
  static constexpr const char* kName = "ReturnChunk";
  using Response = NoPayload;
  uint32_t cache_id = 0;
  uint32_t seg_no = 0;
  uint64_t offset = 0;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, ReturnChunkRequest* out);
};

struct GrowIndexRequest {
  static constexpr MsgType kType = MsgType::kGrowIndex;
  static constexpr const char* kName = "GrowIndex";
  using Response = NoPayload;
  uint32_t cache_id = 0;
  uint32_t seen_tables = 0;  // how many index tables the client has mapped
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, GrowIndexRequest* out);
};

// At most 2^20 sessions, each of at most 2^20 caches.
struct ListSessionsResponse {
  std::vector<SessionInfo> sessions;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, ListSessionsResponse* out);
};

struct ListSessionsRequest {
  static constexpr MsgType kType = MsgType::kListSessions;
  static constexpr const char* kName = "ListSessions";
  using Response = ListSessionsResponse;
  void Encode(WireWriter*) const {}
  static bool Decode(WireReader* r, ListSessionsRequest* out);
};

// uptime_seconds travels in whole milliseconds.
struct ServerInfoResponse {
  ServerInfo info;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, ServerInfoResponse* out);
};

struct ServerInfoRequest {
  static constexpr MsgType kType = MsgType::kServerInfo;
  static constexpr const char* kName = "ServerInfo";
  using Response = ServerInfoResponse;
  void Encode(WireWriter*) const {}
  static bool Decode(WireReader* r, ServerInfoRequest* out);
};

struct StopRequest {
  static constexpr MsgType kType = MsgType::kStop;
  static constexpr const char* kName = "Stop";
  using Response = NoPayload;
  void Encode(WireWriter*) const {}
  static bool Decode(WireReader* r, StopRequest* out);
};

struct SpillPutResponse {
  bool inserted = false;  // false: the id was already cached
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, SpillPutResponse* out);
};

// One encoded row (RowCodec). Its size is not bounded here beyond the frame:
// the daemon answers a row over kMaxSpilledRowBytes with TooLarge.
struct SpillPutRequest {
  static constexpr MsgType kType = MsgType::kSpillPut;
  static constexpr const char* kName = "SpillPut";
  using Response = SpillPutResponse;
  uint32_t cache_id = 0;
  uint64_t row_id = 0;
  std::span<const std::byte> row;  // a view: of the caller's buffer when
                                   // encoding, of the body when decoded
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, SpillPutRequest* out);
};

// One answer per id asked, in order: a kSpill* mark, and the row for
// kSpillFound. Once one is kSpillAskAgain (the response was full), so are
// all that follow, and the client asks for those again. See
// kSpillFramingBytes for the rule that a first found row always fits.
struct SpillGetResponse {
  struct Answer {
    uint8_t mark = kSpillAbsent;
    std::span<const std::byte> row;  // kSpillFound: a view, as in SpillPutRequest
  };
  std::vector<Answer> answers;  // at most kMaxSpillBatch
  // What a found row adds to the body beside its mark: length + bytes.
  static constexpr size_t FoundRowBytes(size_t row_bytes) { return 4 + row_bytes; }
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, SpillGetResponse* out);
};

// ids: 1..kMaxSpillBatch of them.
struct SpillGetRequest {
  static constexpr MsgType kType = MsgType::kSpillGet;
  static constexpr const char* kName = "SpillGet";
  using Response = SpillGetResponse;
  uint32_t cache_id = 0;
  std::vector<uint64_t> ids;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, SpillGetRequest* out);
};

// The connection's staging file for cache_id, of at least min_bytes
// (1..kMaxSpilledRowBytes): made, or the one it has when large enough.
struct SpillStageResponse {
  uint32_t tag = 0;   // names the file: InstancePaths::StageFile(cache_id, tag)
  uint64_t size = 0;  // its bytes
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, SpillStageResponse* out);
};

struct SpillStageRequest {
  static constexpr MsgType kType = MsgType::kSpillStage;
  static constexpr const char* kName = "SpillStage";
  using Response = SpillStageResponse;
  uint32_t cache_id = 0;
  uint64_t min_bytes = 0;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, SpillStageRequest* out);
};

// One byte per row, in order: 1 when the row was added, 0 when its id was
// already cached.
struct SpillPutStagedResponse {
  std::vector<uint8_t> inserted;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, SpillPutStagedResponse* out);
};

// Rows ids[i] of sizes[i] bytes each, encoded (RowCodec) back to back from
// the start of the staging file `tag` (1..kMaxSpillBatch rows; ids and
// sizes of the same length).
struct SpillPutStagedRequest {
  static constexpr MsgType kType = MsgType::kSpillPutStaged;
  static constexpr const char* kName = "SpillPutStaged";
  using Response = SpillPutStagedResponse;
  uint32_t cache_id = 0;
  uint32_t tag = 0;
  std::vector<uint64_t> ids;
  std::vector<uint32_t> sizes;
  void Encode(WireWriter* w) const;
  static bool Decode(WireReader* r, SpillPutStagedRequest* out);
};

template <typename... M>
struct TypeList {};

// Every request, in the order of their types (1..kMaxMsgType).
using Requests =
    TypeList<HelloRequest, CreateSessionRequest, DestroySessionRequest,
             CheckSessionRequest, OpenCacheRequest, LeaseChunkRequest, ReturnChunkRequest,
             GrowIndexRequest, ListSessionsRequest, ServerInfoRequest, StopRequest,
             SpillPutRequest, SpillGetRequest, SpillStageRequest, SpillPutStagedRequest>;

template <typename... R>
constexpr bool CoversEveryType(TypeList<R...>) {
  uint16_t next = 1;
  bool ok = ((static_cast<uint16_t>(R::kType) == next++) && ...);
  return ok && next == kMaxMsgType + 1;
}
static_assert(CoversEveryType(Requests{}),
              "Requests lists each message type once, in order");

// A whole body of message `m`.
template <typename M>
std::string EncodeBody(const M& m) {
  WireWriter w;
  m.Encode(&w);
  return std::move(w.body());
}

// Decodes a whole body as M.
template <typename M>
bool DecodeBody(std::span<const std::byte> body, M* out) {
  WireReader r(body);
  return M::Decode(&r, out);
}

}  // namespace shmcache::protocol
