// A message of every kind with its fields set to values other than their
// defaults: for the format and round-trip tests (protocol_messages_test)
// and the fuzz targets' seed corpora (tests/fuzz/make_seeds.cc).
#pragma once

#include <span>
#include <string_view>

#include "format/protocol_messages.h"

namespace shmcache::protocol::samples {

inline std::span<const std::byte> Bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

template <typename M>
M Sample();

template <>
inline NoPayload Sample() {
  return {};
}
template <>
inline HelloRequest Sample() {
  return {.pid = 4242};
}
template <>
inline HelloResponse Sample() {
  return {.client_id = 7, .shm_prefix = "/dev/shm/shmcache.0.50052."};
}
template <>
inline CreateSessionRequest Sample() {
  return {};
}
template <>
inline CreateSessionResponse Sample() {
  return {.session_id = 0x01020304};
}
template <>
inline DestroySessionRequest Sample() {
  return {.session_id = 11};
}
template <>
inline CheckSessionRequest Sample() {
  return {.session_id = 12};
}
template <>
inline OpenCacheRequest Sample() {
  return {.session_id = 11,
          .name = "train",
          .fingerprint = "fp-1",
          .size_mb = 16,
          .spill_requested = true};
}
template <>
inline OpenCacheResponse Sample() {
  return {.cache_id = 3};
}
template <>
inline LeaseChunkRequest Sample() {
  return {.cache_id = 3,
          .node = 1,
          .need = 4000,
          .has_old = true,
          .old_seg_no = 2,
          .old_offset = 8192};
}
template <>
inline LeaseChunkResponse Sample() {
  return {.seg_no = 2, .offset = 4096, .size = 4u << 20};
}
template <>
inline ReturnChunkRequest Sample() {
  return {.cache_id = 3, .seg_no = 2, .offset = 8192};
}
template <>
inline GrowIndexRequest Sample() {
  return {.cache_id = 3, .seen_tables = 1};
}
template <>
inline ListSessionsRequest Sample() {
  return {};
}
template <>
inline ListSessionsResponse Sample() {
  CacheStats c;
  c.session_id = 11;
  c.cache_id = 3;
  c.name = "train";
  c.mem_rows = 10;
  c.mem_bytes = 30720;
  c.disk_rows = 1;
  c.hits = 5;
  c.misses = 6;
  c.numa_hits = 4;
  c.reserved_bytes = 1 << 22;
  c.budget_bytes = 1 << 23;
  c.full = true;
  c.disk_bytes = 100;
  c.puts_full = 2;
  c.spill_reads = 9;
  c.spills_now = true;
  ListSessionsResponse r;
  r.sessions = {{.session_id = 11, .caches = {c}}, {.session_id = 22, .caches = {}}};
  return r;
}
template <>
inline ServerInfoRequest Sample() {
  return {};
}
template <>
inline ServerInfoResponse Sample() {
  ServerInfo i;
  i.instance = "port 50052";
  i.port = 50052;
  i.socket_path = "/tmp/x.sock";
  i.shm_dir = "/dev/shm";
  i.shm_huge_pages = true;
  i.shm_pages = "tmpfs mounted huge=within_size";
  i.pid = 42;
  i.workers = 4;
  i.log_level = 2;
  i.log_path = "/tmp/log";
  i.spill_dir = "/spill";
  i.memory_cap_bytes = 1ULL << 40;
  i.memory_used_bytes = 12345;
  i.memory_held_bytes = 678;
  i.memory_requested_bytes = 2ULL << 40;
  i.memory_requested_bound = "physical_memory";
  i.memory_cgroup_bytes = 3ULL << 30;
  i.memory_cgroup_limit_bytes = 4ULL << 30;
  i.memory_shm_bytes = 1ULL << 40;
  i.memory_cap_bound = "shm_filesystem";
  i.numa_nodes = 2;
  i.sessions = {1, 2, 3};
  i.connections = 5;
  i.start_time_unix = 1700000000;
  i.uptime_seconds = 1.5;
  return {.info = i};
}
template <>
inline StopRequest Sample() {
  return {};
}
template <>
inline SpillPutRequest Sample() {
  return {.cache_id = 3, .row_id = 5, .row = Bytes("row")};
}
template <>
inline SpillPutResponse Sample() {
  return {.inserted = true};
}
template <>
inline SpillGetRequest Sample() {
  return {.cache_id = 3, .ids = {5, 6, 7}};
}
template <>
inline SpillGetResponse Sample() {
  return {.answers = {
              {kSpillFound, Bytes("row5")}, {kSpillAbsent, {}}, {kSpillAskAgain, {}}}};
}
template <>
inline SpillStageRequest Sample() {
  return {.cache_id = 3, .min_bytes = 4096};
}
template <>
inline SpillStageResponse Sample() {
  return {.tag = 0x0a0b0c0d, .size = 8 << 20};
}
template <>
inline SpillPutStagedRequest Sample() {
  return {.cache_id = 3, .tag = 0x0a0b0c0d, .ids = {5, 6}, .sizes = {24, 32}};
}
template <>
inline SpillPutStagedResponse Sample() {
  return {.inserted = {1, 0}};
}

}  // namespace shmcache::protocol::samples
