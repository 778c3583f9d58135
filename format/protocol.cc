#include "format/protocol.h"

#include <fmt/format.h>

namespace shmcache::protocol {

void EncodeFrameHeader(const FrameHeader& h, std::byte* out) {
  std::memcpy(out, &h.magic, 4);
  std::memcpy(out + 4, &h.version, 2);
  std::memcpy(out + 6, &h.type, 2);
  std::memcpy(out + 8, &h.body_len, 4);
  std::memcpy(out + 12, &h.reserved, 4);
}

Status DecodeFrameHeader(std::span<const std::byte> in, FrameHeader* h) {
  if (in.size() < kFrameHeaderBytes) {
    return Status::Corruption("frame header truncated");
  }
  std::memcpy(&h->magic, in.data(), 4);
  std::memcpy(&h->version, in.data() + 4, 2);
  std::memcpy(&h->type, in.data() + 6, 2);
  std::memcpy(&h->body_len, in.data() + 8, 4);
  std::memcpy(&h->reserved, in.data() + 12, 4);
  if (h->magic != kFrameMagic) {
    return Status::Corruption("not a shmcache frame (bad magic)");
  }
  if (h->version != kProtocolVersion) {
    return Status::NotSupported("protocol version " + std::to_string(h->version) +
                                " differs from " + std::to_string(kProtocolVersion) +
                                "; use matching client and server builds");
  }
  uint16_t t = h->type & ~kResponseBit;
  if (t == 0 || t > kMaxMsgType) return Status::Corruption("unknown message type");
  if (h->body_len > kMaxBodyBytes) return Status::Corruption("frame too large");
  return Status::OK();
}

std::string WireReader::Str(size_t max_len) {
  auto b = Bytes(max_len);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::span<const std::byte> WireReader::Bytes(size_t max_len) {
  uint32_t n = U32();
  if (!ok_ || n > max_len || in_.size() - pos_ < n) {
    ok_ = false;
    return {};
  }
  auto out = in_.subspan(pos_, n);
  pos_ += n;
  return out;
}

Status SpilledRowTooLarge(uint64_t row_id, size_t encoded_bytes) {
  constexpr double kMiB = 1 << 20;
  return Status::TooLarge(
      fmt::format("row {} is not cached: it is {} bytes ({:.1f} MB), more than the {} "
                  "bytes ({:.1f} MB) a row may have to spill to disk; give the cache a "
                  "larger size to keep rows this large in memory",
                  row_id, encoded_bytes, static_cast<double>(encoded_bytes) / kMiB,
                  kMaxSpilledRowBytes, kMaxSpilledRowBytes / kMiB));
}

void WriteStatus(WireWriter& w, const Status& s) {
  w.U8(static_cast<uint8_t>(s.code()));
  w.U8(static_cast<uint8_t>(s.subcode()));
  w.Str(s.message());
}

std::string EncodeStatus(const Status& s) {
  WireWriter w;
  WriteStatus(w, s);
  return std::move(w.body());
}

Status ReadStatus(WireReader& r) {
  uint8_t code = r.U8();
  uint8_t subcode = r.U8();
  std::string msg = r.Str();
  if (!r.ok() || code > static_cast<uint8_t>(Status::Code::kTooLarge) ||
      subcode > static_cast<uint8_t>(Status::SubCode::kLast)) {
    return Status::Corruption("malformed response status");
  }
  return Status(static_cast<Status::Code>(code), static_cast<Status::SubCode>(subcode),
                msg);
}

}  // namespace shmcache::protocol
