#include "protocol.h"

#include <fmt/format.h>

#include <vector>

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
                                " differs from " +
                                std::to_string(kProtocolVersion) +
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
  return Status::TooLarge(fmt::format(
      "row {} is not cached: it is {} bytes ({:.1f} MB), more than the {} "
      "bytes ({:.1f} MB) a row may have to spill to disk; give the cache a "
      "larger size to keep rows this large in memory",
      row_id, encoded_bytes, static_cast<double>(encoded_bytes) / kMiB,
      kMaxSpilledRowBytes, kMaxSpilledRowBytes / kMiB));
}

void WriteStatus(WireWriter& w, const Status& s) {
  w.U8(static_cast<uint8_t>(s.code()));
  w.Str(s.message());
}

Status ReadStatus(WireReader& r) {
  uint8_t code = r.U8();
  std::string msg = r.Str();
  if (!r.ok() || code > static_cast<uint8_t>(Status::Code::kTooLarge)) {
    return Status::Corruption("malformed response status");
  }
  return Status(static_cast<Status::Code>(code), msg);
}

void WriteSessions(WireWriter& w, std::span<const SessionInfo> sessions) {
  w.U32(static_cast<uint32_t>(sessions.size()));
  for (const SessionInfo& s : sessions) {
    w.U32(s.session_id);
    w.U32(static_cast<uint32_t>(s.caches.size()));
    for (const CacheStats& c : s.caches) {
      w.U32(c.cache_id);
      w.Str(c.name);
      w.U64(c.mem_rows);
      w.U64(c.mem_bytes);
      w.U64(c.disk_rows);
      w.U64(c.hits);
      w.U64(c.misses);
      w.U64(c.numa_hits);
      w.U64(c.reserved_bytes);
      w.U64(c.budget_bytes);
      w.U8(c.full ? 1 : 0);
      w.U64(c.disk_bytes);
      w.U64(c.puts_full);
      w.U64(c.spill_reads);
      w.U8(c.spilling ? 1 : 0);
    }
  }
}

bool ReadSessions(WireReader& r, std::vector<SessionInfo>* out) {
  uint32_t n = r.U32();
  if (!r.ok() || n > 1u << 20) return false;
  out->clear();
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    SessionInfo s;
    s.session_id = r.U32();
    uint32_t nc = r.U32();
    if (!r.ok() || nc > 1u << 20) return false;
    for (uint32_t k = 0; k < nc && r.ok(); ++k) {
      CacheStats c;
      c.session_id = s.session_id;
      c.cache_id = r.U32();
      c.name = r.Str();
      c.mem_rows = r.U64();
      c.mem_bytes = r.U64();
      c.disk_rows = r.U64();
      c.hits = r.U64();
      c.misses = r.U64();
      c.numa_hits = r.U64();
      c.reserved_bytes = r.U64();
      c.budget_bytes = r.U64();
      c.full = r.U8() != 0;
      c.disk_bytes = r.U64();
      c.puts_full = r.U64();
      c.spill_reads = r.U64();
      c.spilling = r.U8() != 0;
      s.caches.push_back(std::move(c));
    }
    out->push_back(std::move(s));
  }
  return r.ok();
}

void WriteServerInfo(WireWriter& w, const ServerInfo& i) {
  w.Str(i.instance);
  w.U32(static_cast<uint32_t>(i.port));
  w.Str(i.socket_path);
  w.Str(i.shm_dir);
  w.U32(static_cast<uint32_t>(i.pid));
  w.U32(static_cast<uint32_t>(i.workers));
  w.U32(static_cast<uint32_t>(i.log_level));
  w.Str(i.log_path);
  w.Str(i.spill_dir);
  w.U64(i.memory_cap_bytes);
  w.U64(i.memory_used_bytes);
  w.U64(i.memory_held_bytes);
  w.U32(static_cast<uint32_t>(i.numa_nodes));
  w.U32(static_cast<uint32_t>(i.sessions.size()));
  for (uint32_t s : i.sessions) w.U32(s);
  w.U64(i.connections);
  w.U64(i.start_time_unix);
  w.U64(static_cast<uint64_t>(i.uptime_seconds * 1000));  // milliseconds
  w.U32(i.shm_huge_pages ? 1 : 0);
  w.Str(i.shm_pages);
}

bool ReadServerInfo(WireReader& r, ServerInfo* i) {
  i->instance = r.Str();
  i->port = static_cast<int>(r.U32());
  i->socket_path = r.Str();
  i->shm_dir = r.Str();
  i->pid = static_cast<int>(r.U32());
  i->workers = static_cast<int>(r.U32());
  i->log_level = static_cast<int>(r.U32());
  i->log_path = r.Str();
  i->spill_dir = r.Str();
  i->memory_cap_bytes = r.U64();
  i->memory_used_bytes = r.U64();
  i->memory_held_bytes = r.U64();
  i->numa_nodes = static_cast<int>(r.U32());
  uint32_t n = r.U32();
  if (!r.ok() || n > 1u << 20) return false;
  i->sessions.clear();
  for (uint32_t k = 0; k < n && r.ok(); ++k) i->sessions.push_back(r.U32());
  i->connections = r.U64();
  i->start_time_unix = r.U64();
  i->uptime_seconds = static_cast<double>(r.U64()) / 1000;
  i->shm_huge_pages = r.U32() != 0;
  i->shm_pages = r.Str();
  return r.ok();
}

}  // namespace shmcache::protocol
