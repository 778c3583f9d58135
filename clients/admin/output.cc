#include "clients/admin/output.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace shmcache::admin {
namespace {

// Keys in the order written here, as before.
using Json = nlohmann::ordered_json;

// Indented by two; a cache name that is not UTF-8 has U+FFFD for its bad
// bytes (JSON text is UTF-8).
std::string Dump(const Json& j) {
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace

// Session and cache ids are random 32-bit numbers: 10 digits and a gap.
// A counter prints as the number it is, 0 included, as --json does; "n/a"
// fills the row of a session that has no cache (no counters at all).
std::string SessionsTable(int port, const std::vector<SessionInfo>& sessions) {
  if (sessions.empty()) return "No active sessions.\n";
  std::string out = fmt::format("Listing sessions for server on port {}\n\n", port);
  out += fmt::format("{:>12}{:>12}{:>12}{:>13}{:>16}{:>10}{:>12}{:>12}{:>6}\n", "Session",
                     "Cache Id", "Mem cached", "Disk cached", "Avg cache size",
                     "Numa hit", "Hits", "Misses", "Full");
  for (const SessionInfo& s : sessions) {
    if (s.caches.empty()) {
      out += fmt::format("{:>12}{:>12}{:>12}{:>13}{:>16}{:>10}{:>12}{:>12}{:>6}\n",
                         s.session_id, "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a",
                         "n/a");
    }
    for (const CacheStats& c : s.caches) {
      out += fmt::format("{:>12}{:>12}{:>12}{:>13}{:>16}{:>10}{:>12}{:>12}{:>6}\n",
                         s.session_id, c.cache_id, c.mem_rows, c.disk_rows,
                         c.avg_row_bytes(), c.numa_hits, c.hits, c.misses,
                         c.full ? "yes" : "no");
    }
  }
  return out;
}

std::string SessionsJson(const std::vector<SessionInfo>& sessions) {
  Json out = Json::array();
  for (const SessionInfo& s : sessions) {
    Json caches = Json::array();
    for (const CacheStats& c : s.caches) {
      caches.push_back({{"cache_id", c.cache_id},
                        {"name", c.name},
                        {"mem_cached", c.mem_rows},
                        {"mem_bytes", c.mem_bytes},
                        {"disk_cached", c.disk_rows},
                        {"avg_cache_size", c.avg_row_bytes()},
                        {"numa_hit", c.numa_hits},
                        {"hits", c.hits},
                        {"misses", c.misses},
                        {"reserved_bytes", c.reserved_bytes},
                        {"budget_bytes", c.budget_bytes},
                        {"full", c.full},
                        {"disk_bytes", c.disk_bytes},
                        {"puts_full", c.puts_full},
                        {"spill_reads", c.spill_reads}});
    }
    out.push_back({{"session", s.session_id}, {"caches", std::move(caches)}});
  }
  return Dump(out);
}

// "X MB used of Y MB", and the part of it that readers of dropped sessions
// hold (to a tenth of a MB: often a few pages only).
static std::string MemoryLine(const ServerInfo& i) {
  std::string out = fmt::format("{} MB used of {} MB", i.memory_used_bytes >> 20,
                                i.memory_cap_bytes >> 20);
  if (i.memory_held_bytes == 0) return out;
  return out + fmt::format(" ({:.1f} MB held by readers of dropped sessions)",
                           static_cast<double>(i.memory_held_bytes) / (1 << 20));
}

// "physical_memory 19284 MB, cgroup none, shm_filesystem 24103 MB;
// physical_memory applies": each bound of the cap and the one that applies.
static std::string BoundsLine(const ServerInfo& i) {
  std::string cgroup =
      i.memory_cgroup_bytes
          ? fmt::format("{} MB (of a {} MB limit)", i.memory_cgroup_bytes >> 20,
                        i.memory_cgroup_limit_bytes >> 20)
          : "none";
  return fmt::format("{} {} MB, cgroup {}, shm_filesystem {} MB; {} applies",
                     i.memory_requested_bound, i.memory_requested_bytes >> 20, cgroup,
                     i.memory_shm_bytes >> 20, i.memory_cap_bound);
}

std::string ServerInfoTable(const ServerInfo& i) {
  std::string sessions;
  for (uint32_t s : i.sessions)
    sessions += (sessions.empty() ? "" : ", ") + std::to_string(s);
  return fmt::format(
      "Cache server configuration:\n"
      "  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n"
      "  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n"
      "  {:<18}{}\n  {:<18}{}\n  {:<18}{} ({} pages: {})\n"
      "Active sessions: {}\n",
      "Hostname:", "127.0.0.1", "Instance:", i.instance, "Socket:", i.socket_path,
      "Process id:", i.pid, "Workers:", i.workers, "Log level:", i.log_level,
      "Log file:", i.log_path, "Spill dir:", i.spill_dir.empty() ? "None" : i.spill_dir,
      "Memory cap:", MemoryLine(i), "Memory bounds:", BoundsLine(i),
      "NUMA nodes:", i.numa_nodes, "Shm dir:", i.shm_dir,
      i.shm_huge_pages ? "huge" : "4 KB", i.shm_pages,
      sessions.empty() ? "none" : sessions);
}

std::string ServerInfoJson(const ServerInfo& i) {
  Json spill_dir = i.spill_dir.empty() ? Json(nullptr) : Json(i.spill_dir);
  return Dump(
      {{"hostname", "127.0.0.1"},
       {"port", i.port},
       {"socket", i.socket_path},
       {"shm_dir", i.shm_dir},
       {"shm_huge_pages", i.shm_huge_pages},
       {"shm_pages", i.shm_pages},
       {"pid", i.pid},
       {"workers", i.workers},
       {"log_level", i.log_level},
       {"log_file", i.log_path},
       {"spill_dir", spill_dir},
       {"memory_cap_bytes", i.memory_cap_bytes},
       {"memory_used_bytes", i.memory_used_bytes},
       {"memory_held_bytes", i.memory_held_bytes},
       {"memory_cap_bound", i.memory_cap_bound},
       {"memory_bounds",
        {{i.memory_requested_bound, i.memory_requested_bytes},
         {"cgroup", i.memory_cgroup_bytes ? Json(i.memory_cgroup_bytes) : Json(nullptr)},
         {"cgroup_limit", i.memory_cgroup_limit_bytes ? Json(i.memory_cgroup_limit_bytes)
                                                      : Json(nullptr)},
         {"shm_filesystem", i.memory_shm_bytes}}},
       {"numa_nodes", i.numa_nodes},
       {"sessions", i.sessions},
       {"connections", i.connections},
       {"start_time_unix", i.start_time_unix},
       {"uptime_seconds", std::round(i.uptime_seconds * 1000) / 1000}});
}

}  // namespace shmcache::admin
