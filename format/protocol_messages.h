// Every message of the control protocol, defined once: one struct per
// request and per response, and its body described once by its static
// Fields(m, io): the fields in wire order with their types and bounds, which
// EncodeMessage walks to write a body and DecodeMessage to read one
// (protocol_fields.h). The client encodes requests and decodes responses
// (ClientImpl::Call); the daemon decodes requests and encodes responses
// (RequestHandler); tests and fuzz targets use the same structs.
//
// A response body's status (WriteStatus, protocol.h) comes before the
// message and is read first. Flags travel as one byte, 0 or 1; any other
// value is malformed.
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
#include "format/protocol_fields.h"
#include "format/stats_fields.h"
#include "shmcache/stats.h"
#include "shmcache/types.h"

namespace shmcache::protocol {

// Counts of listed sessions, and of caches in one session.
inline constexpr uint32_t kMaxListed = 1u << 20;

// The response of requests that answer with their status alone.
struct NoPayload {
  template <typename M, typename IO>
  static void Fields(M&, IO&) {}
};

struct HelloResponse {
  uint32_t client_id = 0;
  std::string shm_prefix;  // full path prefix of the instance's shm files
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.client_id);
    io.Str(m.shm_prefix);
  }
};

struct HelloRequest {
  static constexpr MsgType kType = MsgType::kHello;
  static constexpr const char* kName = "Hello";
  using Response = HelloResponse;
  uint32_t pid = 0;  // the client's, for the log
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.pid);
  }
};

struct CreateSessionResponse {
  uint32_t session_id = 0;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.session_id);
  }
};

struct CreateSessionRequest {
  static constexpr MsgType kType = MsgType::kCreateSession;
  static constexpr const char* kName = "CreateSession";
  using Response = CreateSessionResponse;
  template <typename M, typename IO>
  static void Fields(M&, IO&) {}
};

struct DestroySessionRequest {
  static constexpr MsgType kType = MsgType::kDestroySession;
  static constexpr const char* kName = "DestroySession";
  using Response = NoPayload;
  uint32_t session_id = 0;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.session_id);
  }
};

struct CheckSessionRequest {
  static constexpr MsgType kType = MsgType::kCheckSession;
  static constexpr const char* kName = "CheckSession";
  using Response = NoPayload;
  uint32_t session_id = 0;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.session_id);
  }
};

struct OpenCacheResponse {
  uint32_t cache_id = 0;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.cache_id);
  }
};

// name and fingerprint: at most kMaxNameBytes each.
struct OpenCacheRequest {
  static constexpr MsgType kType = MsgType::kOpenCache;
  static constexpr const char* kName = "OpenCache";
  using Response = OpenCacheResponse;
  uint32_t session_id = 0;
  std::string name;
  std::string fingerprint;
  uint64_t size_mb = 0;
  bool spill_requested = false;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.session_id);
    io.Str(m.name, kMaxNameBytes);
    io.Str(m.fingerprint, kMaxNameBytes);
    io.U64(m.size_mb);
    io.Flag(m.spill_requested);
  }
};

struct LeaseChunkResponse {
  uint32_t seg_no = 0;
  uint64_t offset = 0;  // of the chunk inside its segment
  uint64_t size = 0;    // of the chunk, its header included
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.seg_no);
    io.U64(m.offset);
    io.U64(m.size);
  }
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
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.cache_id);
    io.U32(m.node);
    io.U64(m.need);
    io.Flag(m.has_old);
    io.U32(m.old_seg_no);
    io.U64(m.old_offset);
    io.Check(m.need != 0 && m.need <= kMaxLeaseBytes && m.node <= kMaxLeaseNode);
  }
};

struct ReturnChunkRequest {
  static constexpr MsgType kType = MsgType::kReturnChunk;
  static constexpr const char* kName = "ReturnChunk";
  using Response = NoPayload;
  uint32_t cache_id = 0;
  uint32_t seg_no = 0;
  uint64_t offset = 0;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.cache_id);
    io.U32(m.seg_no);
    io.U64(m.offset);
  }
};

struct GrowIndexRequest {
  static constexpr MsgType kType = MsgType::kGrowIndex;
  static constexpr const char* kName = "GrowIndex";
  using Response = NoPayload;
  uint32_t cache_id = 0;
  uint32_t seen_tables = 0;  // how many index tables the client has mapped
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.cache_id);
    io.U32(m.seen_tables);
  }
};

// At most 2^20 sessions, each of at most 2^20 caches.
struct ListSessionsResponse {
  std::vector<SessionInfo> sessions;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.List(m.sessions, kMaxListed, [&io](auto& s) {
      io.U32(s.session_id);
      io.List(s.caches, kMaxListed, [&](auto& c) {
        StatWireFields(c, io);
        if constexpr (IO::kReading) c.session_id = s.session_id;
      });
    });
  }
};

struct ListSessionsRequest {
  static constexpr MsgType kType = MsgType::kListSessions;
  static constexpr const char* kName = "ListSessions";
  using Response = ListSessionsResponse;
  template <typename M, typename IO>
  static void Fields(M&, IO&) {}
};

// uptime_seconds travels in whole milliseconds.
struct ServerInfoResponse {
  ServerInfo info;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    auto& i = m.info;
    io.Str(i.instance);
    io.Int(i.port);
    io.Str(i.socket_path);
    io.Str(i.shm_dir);
    io.Int(i.pid);
    io.Int(i.workers);
    io.Int(i.log_level);
    io.Str(i.log_path);
    io.Str(i.spill_dir);
    io.U64(i.memory_cap_bytes);
    io.U64(i.memory_used_bytes);
    io.U64(i.memory_held_bytes);
    io.Int(i.numa_nodes);
    io.List(i.sessions, kMaxListed, [&io](auto& id) { io.U32(id); });
    io.U64(i.connections);
    io.U64(i.start_time_unix);
    io.Millis(i.uptime_seconds);
    io.Flag32(i.shm_huge_pages);
    io.Str(i.shm_pages);
    io.U64(i.memory_requested_bytes);
    io.Str(i.memory_requested_bound);
    io.U64(i.memory_cgroup_bytes);
    io.U64(i.memory_cgroup_limit_bytes);
    io.U64(i.memory_shm_bytes);
    io.Str(i.memory_cap_bound);
  }
};

struct ServerInfoRequest {
  static constexpr MsgType kType = MsgType::kServerInfo;
  static constexpr const char* kName = "ServerInfo";
  using Response = ServerInfoResponse;
  template <typename M, typename IO>
  static void Fields(M&, IO&) {}
};

struct StopRequest {
  static constexpr MsgType kType = MsgType::kStop;
  static constexpr const char* kName = "Stop";
  using Response = NoPayload;
  template <typename M, typename IO>
  static void Fields(M&, IO&) {}
};

struct SpillPutResponse {
  bool inserted = false;  // false: the id was already cached
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.Flag(m.inserted);
  }
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
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.cache_id);
    io.U64(m.row_id);
    io.Bytes(m.row);
  }
};

// One answer per id asked, in order: a kSpill* mark, and the row for
// kSpillFound or the message for kSpillFailed. Once one is kSpillAskAgain (the response
// was full), so are all that follow, and the client asks for those again. See
// kSpillFramingBytes for the rule that a first found row always fits.
struct SpillGetResponse {
  struct Answer {
    uint8_t mark = kSpillAbsent;
    // kSpillFound: the row, kSpillFailed: the error's text; a view, as in
    // SpillPutRequest.
    std::span<const std::byte> row;
  };
  std::vector<Answer> answers;  // at most kMaxSpillBatch
  // What a found row adds to the body beside its mark: length + bytes.
  static constexpr size_t FoundRowBytes(size_t row_bytes) { return 4 + row_bytes; }
  static constexpr bool CarriesBytes(uint8_t mark) {
    return mark == kSpillFound || mark == kSpillFailed;
  }
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    if constexpr (!IO::kReading) {  // up to a whole frame of rows
      size_t bytes = 4 + m.answers.size();
      for (const Answer& a : m.answers) {
        if (CarriesBytes(a.mark)) bytes += FoundRowBytes(a.row.size());
      }
      io.Reserve(bytes);
    }
    bool asked_again = false;
    io.List(m.answers, kMaxSpillBatch, [&](auto& a) {
      io.U8(a.mark);
      io.Check(a.mark <= kSpillFailed && (!asked_again || a.mark == kSpillAskAgain));
      asked_again = a.mark == kSpillAskAgain;
      if (CarriesBytes(a.mark)) io.Bytes(a.row);
    });
  }
};

// ids: 1..kMaxSpillBatch of them.
struct SpillGetRequest {
  static constexpr MsgType kType = MsgType::kSpillGet;
  static constexpr const char* kName = "SpillGet";
  using Response = SpillGetResponse;
  uint32_t cache_id = 0;
  std::vector<uint64_t> ids;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.cache_id);
    io.List(
        m.ids, kMaxSpillBatch, [&io](auto& id) { io.U64(id); }, /*min=*/1);
  }
};

// The connection's staging file for cache_id, of at least min_bytes
// (1..kMaxSpilledRowBytes): made, or the one it has when large enough.
struct SpillStageResponse {
  uint32_t tag = 0;   // names the file: InstancePaths::StageFile(cache_id, tag)
  uint64_t size = 0;  // its bytes
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.tag);
    io.U64(m.size);
  }
};

struct SpillStageRequest {
  static constexpr MsgType kType = MsgType::kSpillStage;
  static constexpr const char* kName = "SpillStage";
  using Response = SpillStageResponse;
  uint32_t cache_id = 0;
  uint64_t min_bytes = 0;
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.cache_id);
    io.U64(m.min_bytes);
    io.Check(m.min_bytes != 0 && m.min_bytes <= kMaxSpilledRowBytes);
  }
};

// One byte per row, in order: 1 when the row was added, 0 when its id was
// already cached.
struct SpillPutStagedResponse {
  std::vector<uint8_t> inserted;  // at most kMaxSpillBatch
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    // A count and a byte each: the bytes of a length-prefixed byte string.
    io.List(m.inserted, kMaxSpillBatch, [&io](auto& b) {
      io.U8(b);
      io.Check(b <= 1);
    });
  }
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
  template <typename M, typename IO>
  static void Fields(M& m, IO& io) {
    io.U32(m.cache_id);
    io.U32(m.tag);
    // One count for both lists: the ids, then as many sizes.
    io.List(
        m.ids, kMaxSpillBatch, [&io](auto& id) { io.U64(id); }, /*min=*/1);
    if constexpr (IO::kReading) m.sizes.resize(m.ids.size());
    for (auto& n : m.sizes) io.U32(n);
  }
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
  EncodeMessage(m, &w);
  return std::move(w.body());
}

// Decodes a whole body as M (DecodeMessage).
template <typename M>
bool DecodeBody(std::span<const std::byte> body, M* out) {
  WireReader r(body);
  return DecodeMessage(&r, out);
}

}  // namespace shmcache::protocol
