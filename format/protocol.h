// The control protocol between clients and shmcached, over a Unix-domain
// stream socket. Only the control plane travels here (sessions, cache
// opens, chunk leases, listings); rows never do, except spilled ones.
//
// Frame: FrameHeader (16 bytes, little-endian) + body of body_len bytes.
// A response carries the request's type with kResponseBit set, and its body
// starts with a status code (u8) and a message (string), then the payload.
// Body fields: integers little-endian; strings and blobs as u32 length +
// bytes. Every length is checked against what is left of the body and
// against a per-field maximum; a frame with bytes left over is malformed.
// The body of each message is defined in protocol_messages.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "shmcache/status.h"

namespace shmcache::protocol {

inline constexpr uint32_t kFrameMagic = 0x50434D53;  // "SMCP"
// 3: a listing carries each cache's `spills_now` (CacheStats).
// 4: server info carries the bounds of the memory cap.
// 5: a status carries its subcode (why a cache is Full) after its code.
// 6: spilled rows are staged in shared memory (kSpillStage, kSpillPutStaged).
// 7: a spilled row whose own read failed is answered kSpillFailed.
// 8: the daemon may take back room a writer's chunk holds past its `used`
//    mark (layout::kRoomTaken): a writer moves `used` by compare-and-swap.
inline constexpr uint16_t kProtocolVersion = 8;
inline constexpr uint16_t kResponseBit = 0x8000;
inline constexpr uint32_t kMaxBodyBytes = 64u << 20;
inline constexpr size_t kMaxStringBytes = 4096;
// The largest row a chunk lease may ask room for.
inline constexpr uint64_t kMaxLeaseBytes = 1ULL << 33;
// Spilled-row reads are batched: at most this many ids per request. Each
// answer is one of the kSpill* markers, followed by the row for kSpillFound
// and by what went wrong for kSpillFailed (a row whose own read failed, its
// table block failing its checksum, or whose bytes are not the row: the
// rows beside it are still answered; since version 7). The daemon has then
// dropped the row from the index (Store::SpillGet), which the client
// reports as Status::RowDropped; the frame is the same as in version 7.
inline constexpr uint32_t kMaxSpillBatch = 1024;
inline constexpr uint8_t kSpillAbsent = 0;
inline constexpr uint8_t kSpillFound = 1;
inline constexpr uint8_t kSpillAskAgain = 2;
inline constexpr uint8_t kSpillFailed = 3;
// A spilled row travels whole in one frame, both in kSpillPut and in the
// answer to kSpillGet, so it may be at most the frame limit less room for
// the fields around it. The daemon answers a row alone when it does not fit
// beside others, so every row of this size can be read back; a larger row
// is refused at put (SpilledRowTooLarge) before anything is sent.
inline constexpr uint32_t kSpillFramingBytes = 4096;
inline constexpr uint32_t kMaxSpilledRowBytes = kMaxBodyBytes - kSpillFramingBytes;
// Room for the answer's status (u8 + empty string), count, one mark per id
// and the row's length; and for the request's cache id, row id and length.
static_assert(kSpillFramingBytes >= 5 + 4 + kMaxSpillBatch + 4);
static_assert(kSpillFramingBytes >= 4 + 8 + 4);

enum class MsgType : uint16_t {
  kHello = 1,
  kCreateSession = 2,
  kDestroySession = 3,
  kCheckSession = 4,
  kOpenCache = 5,
  kLeaseChunk = 6,
  kReturnChunk = 7,
  kGrowIndex = 8,
  kListSessions = 9,
  kServerInfo = 10,
  kStop = 11,
  kSpillPut = 12,
  kSpillGet = 13,
  kSpillStage = 14,
  kSpillPutStaged = 15,
};
inline constexpr uint16_t kMaxMsgType = 15;

// Spilled rows written in batches without crossing the socket: the daemon
// makes a staging file in the shm dir for one connection and cache
// (kSpillStage); the client encodes rows into it back to back and sends
// only their ids and sizes (kSpillPutStaged, at most kMaxSpillBatch rows);
// the daemon copies them into one RocksDB write batch, checks the copy and
// writes it. A stage is kSpillStageBytes, or larger for a row that needs it
// (up to kMaxSpilledRowBytes), and lives as long as its connection.
inline constexpr uint64_t kSpillStageBytes = 8u << 20;

// Requests whose answer waits on the daemon's spill disk (RocksDB reads and
// writes of rows up to kMaxSpilledRowBytes). A client waits up to
// kDiskRequestTimeoutMs for them, not the request timeout meant to notice a
// dead server: a slow or busy disk must not look like a server gone.
inline constexpr int kDiskRequestTimeoutMs = 60000;
constexpr bool WaitsOnDisk(MsgType type) {
  return type == MsgType::kSpillPut || type == MsgType::kSpillGet ||
         type == MsgType::kSpillPutStaged;
}

// Returning a chunk only hands its unused tail back early: the daemon takes
// it back anyway when the client's process is gone. A client closing a cache
// (at exit too) waits at most kReturnChunkTimeoutMs for that answer, so a
// stopped or hung server does not hold up a process's exit for the request
// timeout.
inline constexpr int kReturnChunkTimeoutMs = 500;

// How long a client waits for the answer to `type`, given its request
// timeout.
constexpr int RequestTimeoutMs(MsgType type, int request_timeout_ms) {
  if (WaitsOnDisk(type)) {
    return request_timeout_ms > kDiskRequestTimeoutMs ? request_timeout_ms
                                                      : kDiskRequestTimeoutMs;
  }
  if (type == MsgType::kReturnChunk) {
    return request_timeout_ms < kReturnChunkTimeoutMs ? request_timeout_ms
                                                      : kReturnChunkTimeoutMs;
  }
  return request_timeout_ms;
}

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kProtocolVersion;
  uint16_t type = 0;
  uint32_t body_len = 0;
  uint32_t reserved = 0;
};
inline constexpr size_t kFrameHeaderBytes = 16;

void EncodeFrameHeader(const FrameHeader& h, std::byte* out);
// Validates magic, version, type and body length.
Status DecodeFrameHeader(std::span<const std::byte> in, FrameHeader* out);

// Appends fields to a body.
class WireWriter {
 public:
  void U8(uint8_t v) { Put(&v, 1); }
  void U16(uint16_t v) { Put(&v, 2); }
  void U32(uint32_t v) { Put(&v, 4); }
  void U64(uint64_t v) { Put(&v, 8); }
  void Flag(bool v) { U8(v ? 1 : 0); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Put(s.data(), s.size());
  }
  void Bytes(std::span<const std::byte> b) {
    U32(static_cast<uint32_t>(b.size()));
    Put(b.data(), b.size());
  }
  void Put(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  const std::string& body() const { return buf_; }
  std::string& body() { return buf_; }

 private:
  std::string buf_;
};

// Reads fields from a body. After the first failure every read fails and
// ok() is false; callers check once at the end.
class WireReader {
 public:
  explicit WireReader(std::span<const std::byte> body) : in_(body) {}
  uint8_t U8() { return Get<uint8_t>(); }
  uint16_t U16() { return Get<uint16_t>(); }
  uint32_t U32() { return Get<uint32_t>(); }
  uint64_t U64() { return Get<uint64_t>(); }
  // One byte, 0 or 1.
  bool Flag() {
    uint8_t v = U8();
    if (v > 1) ok_ = false;
    return v == 1;
  }
  std::string Str(size_t max_len = kMaxStringBytes);
  // A view of the next blob; valid while the body is.
  std::span<const std::byte> Bytes(size_t max_len = kMaxBodyBytes);
  bool ok() const { return ok_; }
  // Marks the body malformed: a field was read but lies outside its range.
  void Fail() { ok_ = false; }
  // True when every byte was consumed and nothing failed.
  bool Done() const { return ok_ && pos_ == in_.size(); }
  // The bytes read so far.
  size_t consumed() const { return pos_; }

 private:
  template <typename T>
  T Get() {
    T v{};
    if (!ok_ || in_.size() - pos_ < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// TooLarge naming the row, its encoded size and kMaxSpilledRowBytes.
Status SpilledRowTooLarge(uint64_t row_id, size_t encoded_bytes);

// Response bodies start with the status.
void WriteStatus(WireWriter& w, const Status& s);
Status ReadStatus(WireReader& r);
// A response body of the status alone: the answer to a request that failed.
std::string EncodeStatus(const Status& s);

}  // namespace shmcache::protocol
