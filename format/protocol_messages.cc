#include "format/protocol_messages.h"

#include <limits>

#include "format/layout.h"

namespace shmcache::protocol {

namespace {

// Counts of listed sessions, and of caches in one session.
constexpr uint32_t kMaxListed = 1u << 20;

// Whole milliseconds; out-of-range values (never the daemon's own) are
// clamped rather than left to an undefined conversion.
uint64_t Millis(double seconds) {
  double ms = seconds * 1000;
  if (!(ms > 0)) return 0;
  if (ms >= 0x1p64) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(ms);
}

void EncodeCache(const CacheStats& c, WireWriter* w) {
  w->U32(c.cache_id);
  w->Str(c.name);
  w->U64(c.mem_rows);
  w->U64(c.mem_bytes);
  w->U64(c.disk_rows);
  w->U64(c.hits);
  w->U64(c.misses);
  w->U64(c.numa_hits);
  w->U64(c.reserved_bytes);
  w->U64(c.budget_bytes);
  w->Flag(c.full);
  w->U64(c.disk_bytes);
  w->U64(c.puts_full);
  w->U64(c.spill_reads);
  w->Flag(c.spilling);
}

void DecodeCache(WireReader* r, CacheStats* c) {
  c->cache_id = r->U32();
  c->name = r->Str();
  c->mem_rows = r->U64();
  c->mem_bytes = r->U64();
  c->disk_rows = r->U64();
  c->hits = r->U64();
  c->misses = r->U64();
  c->numa_hits = r->U64();
  c->reserved_bytes = r->U64();
  c->budget_bytes = r->U64();
  c->full = r->Flag();
  c->disk_bytes = r->U64();
  c->puts_full = r->U64();
  c->spill_reads = r->U64();
  c->spilling = r->Flag();
}

}  // namespace

bool NoPayload::Decode(WireReader* r, NoPayload*) { return r->Done(); }

void HelloRequest::Encode(WireWriter* w) const { w->U32(pid); }

bool HelloRequest::Decode(WireReader* r, HelloRequest* out) {
  out->pid = r->U32();
  return r->Done();
}

void HelloResponse::Encode(WireWriter* w) const {
  w->U32(client_id);
  w->Str(shm_prefix);
}

bool HelloResponse::Decode(WireReader* r, HelloResponse* out) {
  out->client_id = r->U32();
  out->shm_prefix = r->Str();
  return r->Done();
}

bool CreateSessionRequest::Decode(WireReader* r, CreateSessionRequest*) {
  return r->Done();
}

void CreateSessionResponse::Encode(WireWriter* w) const { w->U32(session_id); }

bool CreateSessionResponse::Decode(WireReader* r, CreateSessionResponse* out) {
  out->session_id = r->U32();
  return r->Done();
}

void DestroySessionRequest::Encode(WireWriter* w) const { w->U32(session_id); }

bool DestroySessionRequest::Decode(WireReader* r, DestroySessionRequest* out) {
  out->session_id = r->U32();
  return r->Done();
}

void CheckSessionRequest::Encode(WireWriter* w) const { w->U32(session_id); }

bool CheckSessionRequest::Decode(WireReader* r, CheckSessionRequest* out) {
  out->session_id = r->U32();
  return r->Done();
}

void OpenCacheRequest::Encode(WireWriter* w) const {
  w->U32(session_id);
  w->Str(name);
  w->Str(fingerprint);
  w->U64(size_mb);
  w->Flag(spilling);
}

bool OpenCacheRequest::Decode(WireReader* r, OpenCacheRequest* out) {
  out->session_id = r->U32();
  out->name = r->Str(layout::kMaxNameBytes);
  out->fingerprint = r->Str(layout::kMaxNameBytes);
  out->size_mb = r->U64();
  out->spilling = r->Flag();
  return r->Done();
}

void OpenCacheResponse::Encode(WireWriter* w) const { w->U32(cache_id); }

bool OpenCacheResponse::Decode(WireReader* r, OpenCacheResponse* out) {
  out->cache_id = r->U32();
  return r->Done();
}

void LeaseChunkRequest::Encode(WireWriter* w) const {
  w->U32(cache_id);
  w->U32(node);
  w->U64(need);
  w->Flag(has_old);
  w->U32(old_seg_no);
  w->U64(old_offset);
}

bool LeaseChunkRequest::Decode(WireReader* r, LeaseChunkRequest* out) {
  out->cache_id = r->U32();
  out->node = r->U32();
  out->need = r->U64();
  out->has_old = r->Flag();
  out->old_seg_no = r->U32();
  out->old_offset = r->U64();
  if (out->need == 0 || out->need > kMaxLeaseBytes || out->node > kMaxLeaseNode) {
    r->Fail();
  }
  return r->Done();
}

void LeaseChunkResponse::Encode(WireWriter* w) const {
  w->U32(seg_no);
  w->U64(offset);
  w->U64(size);
}

bool LeaseChunkResponse::Decode(WireReader* r, LeaseChunkResponse* out) {
  out->seg_no = r->U32();
  out->offset = r->U64();
  out->size = r->U64();
  return r->Done();
}

void ReturnChunkRequest::Encode(WireWriter* w) const {
  w->U32(cache_id);
  w->U32(seg_no);
  w->U64(offset);
}

bool ReturnChunkRequest::Decode(WireReader* r, ReturnChunkRequest* out) {
  out->cache_id = r->U32();
  out->seg_no = r->U32();
  out->offset = r->U64();
  return r->Done();
}

void GrowIndexRequest::Encode(WireWriter* w) const {
  w->U32(cache_id);
  w->U32(seen_tables);
}

bool GrowIndexRequest::Decode(WireReader* r, GrowIndexRequest* out) {
  out->cache_id = r->U32();
  out->seen_tables = r->U32();
  return r->Done();
}

bool ListSessionsRequest::Decode(WireReader* r, ListSessionsRequest*) {
  return r->Done();
}

void ListSessionsResponse::Encode(WireWriter* w) const {
  w->U32(static_cast<uint32_t>(sessions.size()));
  for (const SessionInfo& s : sessions) {
    w->U32(s.session_id);
    w->U32(static_cast<uint32_t>(s.caches.size()));
    for (const CacheStats& c : s.caches) EncodeCache(c, w);
  }
}

bool ListSessionsResponse::Decode(WireReader* r, ListSessionsResponse* out) {
  out->sessions.clear();
  uint32_t n = r->U32();
  if (n > kMaxListed) r->Fail();
  for (uint32_t i = 0; i < n && r->ok(); ++i) {
    SessionInfo s;
    s.session_id = r->U32();
    uint32_t nc = r->U32();
    if (nc > kMaxListed) r->Fail();
    for (uint32_t k = 0; k < nc && r->ok(); ++k) {
      CacheStats c;
      c.session_id = s.session_id;
      DecodeCache(r, &c);
      s.caches.push_back(std::move(c));
    }
    out->sessions.push_back(std::move(s));
  }
  return r->Done();
}

bool ServerInfoRequest::Decode(WireReader* r, ServerInfoRequest*) { return r->Done(); }

void ServerInfoResponse::Encode(WireWriter* w) const {
  w->Str(info.instance);
  w->U32(static_cast<uint32_t>(info.port));
  w->Str(info.socket_path);
  w->Str(info.shm_dir);
  w->U32(static_cast<uint32_t>(info.pid));
  w->U32(static_cast<uint32_t>(info.workers));
  w->U32(static_cast<uint32_t>(info.log_level));
  w->Str(info.log_path);
  w->Str(info.spill_dir);
  w->U64(info.memory_cap_bytes);
  w->U64(info.memory_used_bytes);
  w->U64(info.memory_held_bytes);
  w->U32(static_cast<uint32_t>(info.numa_nodes));
  w->U32(static_cast<uint32_t>(info.sessions.size()));
  for (uint32_t s : info.sessions) w->U32(s);
  w->U64(info.connections);
  w->U64(info.start_time_unix);
  w->U64(Millis(info.uptime_seconds));
  w->U32(info.shm_huge_pages ? 1 : 0);
  w->Str(info.shm_pages);
  w->U64(info.memory_requested_bytes);
  w->Str(info.memory_requested_bound);
  w->U64(info.memory_cgroup_bytes);
  w->U64(info.memory_cgroup_limit_bytes);
  w->U64(info.memory_shm_bytes);
  w->Str(info.memory_cap_bound);
}

bool ServerInfoResponse::Decode(WireReader* r, ServerInfoResponse* out) {
  ServerInfo& i = out->info;
  i.instance = r->Str();
  i.port = static_cast<int>(r->U32());
  i.socket_path = r->Str();
  i.shm_dir = r->Str();
  i.pid = static_cast<int>(r->U32());
  i.workers = static_cast<int>(r->U32());
  i.log_level = static_cast<int>(r->U32());
  i.log_path = r->Str();
  i.spill_dir = r->Str();
  i.memory_cap_bytes = r->U64();
  i.memory_used_bytes = r->U64();
  i.memory_held_bytes = r->U64();
  i.numa_nodes = static_cast<int>(r->U32());
  uint32_t n = r->U32();
  if (n > kMaxListed) r->Fail();
  i.sessions.clear();
  for (uint32_t k = 0; k < n && r->ok(); ++k) i.sessions.push_back(r->U32());
  i.connections = r->U64();
  i.start_time_unix = r->U64();
  i.uptime_seconds = static_cast<double>(r->U64()) / 1000;
  uint32_t huge = r->U32();
  if (huge > 1) r->Fail();
  i.shm_huge_pages = huge == 1;
  i.shm_pages = r->Str();
  i.memory_requested_bytes = r->U64();
  i.memory_requested_bound = r->Str();
  i.memory_cgroup_bytes = r->U64();
  i.memory_cgroup_limit_bytes = r->U64();
  i.memory_shm_bytes = r->U64();
  i.memory_cap_bound = r->Str();
  return r->Done();
}

bool StopRequest::Decode(WireReader* r, StopRequest*) { return r->Done(); }

void SpillPutRequest::Encode(WireWriter* w) const {
  w->U32(cache_id);
  w->U64(row_id);
  w->Bytes(row);
}

bool SpillPutRequest::Decode(WireReader* r, SpillPutRequest* out) {
  out->cache_id = r->U32();
  out->row_id = r->U64();
  out->row = r->Bytes();
  return r->Done();
}

void SpillPutResponse::Encode(WireWriter* w) const { w->Flag(inserted); }

bool SpillPutResponse::Decode(WireReader* r, SpillPutResponse* out) {
  out->inserted = r->Flag();
  return r->Done();
}

void SpillStageRequest::Encode(WireWriter* w) const {
  w->U32(cache_id);
  w->U64(min_bytes);
}

bool SpillStageRequest::Decode(WireReader* r, SpillStageRequest* out) {
  out->cache_id = r->U32();
  out->min_bytes = r->U64();
  if (out->min_bytes == 0 || out->min_bytes > kMaxSpilledRowBytes) r->Fail();
  return r->Done();
}

void SpillStageResponse::Encode(WireWriter* w) const {
  w->U32(tag);
  w->U64(size);
}

bool SpillStageResponse::Decode(WireReader* r, SpillStageResponse* out) {
  out->tag = r->U32();
  out->size = r->U64();
  return r->Done();
}

void SpillPutStagedRequest::Encode(WireWriter* w) const {
  w->U32(cache_id);
  w->U32(tag);
  w->U32(static_cast<uint32_t>(ids.size()));
  for (uint64_t id : ids) w->U64(id);
  for (uint32_t n : sizes) w->U32(n);
}

bool SpillPutStagedRequest::Decode(WireReader* r, SpillPutStagedRequest* out) {
  out->cache_id = r->U32();
  out->tag = r->U32();
  uint32_t n = r->U32();
  if (n == 0 || n > kMaxSpillBatch) r->Fail();
  out->ids.clear();
  out->sizes.clear();
  for (uint32_t i = 0; i < n && r->ok(); ++i) out->ids.push_back(r->U64());
  for (uint32_t i = 0; i < n && r->ok(); ++i) out->sizes.push_back(r->U32());
  return r->Done();
}

void SpillPutStagedResponse::Encode(WireWriter* w) const {
  w->Bytes(std::as_bytes(std::span(inserted)));
}

bool SpillPutStagedResponse::Decode(WireReader* r, SpillPutStagedResponse* out) {
  std::span<const std::byte> b = r->Bytes(kMaxSpillBatch);
  out->inserted.resize(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    out->inserted[i] = static_cast<uint8_t>(b[i]);
    if (out->inserted[i] > 1) r->Fail();
  }
  return r->Done();
}

void SpillGetRequest::Encode(WireWriter* w) const {
  w->U32(cache_id);
  w->U32(static_cast<uint32_t>(ids.size()));
  for (uint64_t id : ids) w->U64(id);
}

bool SpillGetRequest::Decode(WireReader* r, SpillGetRequest* out) {
  out->cache_id = r->U32();
  uint32_t n = r->U32();
  if (n == 0 || n > kMaxSpillBatch) r->Fail();
  out->ids.clear();
  for (uint32_t i = 0; i < n && r->ok(); ++i) out->ids.push_back(r->U64());
  return r->Done();
}

void SpillGetResponse::Encode(WireWriter* w) const {
  size_t bytes = 4 + answers.size();
  for (const Answer& a : answers) {
    if (a.mark == kSpillFound) bytes += FoundRowBytes(a.row.size());
  }
  w->body().reserve(w->body().size() + bytes);  // up to a whole frame of rows
  w->U32(static_cast<uint32_t>(answers.size()));
  for (const Answer& a : answers) {
    w->U8(a.mark);
    if (a.mark == kSpillFound) w->Bytes(a.row);
  }
}

bool SpillGetResponse::Decode(WireReader* r, SpillGetResponse* out) {
  out->answers.clear();
  uint32_t n = r->U32();
  if (n > kMaxSpillBatch) r->Fail();
  bool asked_again = false;
  for (uint32_t i = 0; i < n && r->ok(); ++i) {
    Answer a;
    a.mark = r->U8();
    if (a.mark > kSpillAskAgain || (asked_again && a.mark != kSpillAskAgain)) {
      r->Fail();
    }
    asked_again = a.mark == kSpillAskAgain;
    if (a.mark == kSpillFound) a.row = r->Bytes();
    out->answers.push_back(a);
  }
  return r->Done();
}

}  // namespace shmcache::protocol
