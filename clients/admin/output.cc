#include "output.h"

#include <fmt/format.h>

namespace shmcache::admin {
namespace {

std::string OrNa(uint64_t v) { return v ? std::to_string(v) : "n/a"; }

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

// Session and cache ids are random 32-bit numbers: 10 digits and a gap.
std::string SessionsTable(int port, const std::vector<SessionInfo>& sessions) {
  if (sessions.empty()) return "No active sessions.\n";
  std::string out = fmt::format("Listing sessions for server on port {}\n\n", port);
  out += fmt::format("{:>12}{:>12}{:>12}{:>13}{:>16}{:>10}{:>12}{:>12}{:>6}\n",
                     "Session", "Cache Id", "Mem cached", "Disk cached",
                     "Avg cache size", "Numa hit", "Hits", "Misses", "Full");
  for (const SessionInfo& s : sessions) {
    if (s.caches.empty()) {
      out += fmt::format("{:>12}{:>12}{:>12}{:>13}{:>16}{:>10}{:>12}{:>12}{:>6}\n",
                         s.session_id, "n/a", "n/a", "n/a", "n/a", "n/a", "n/a",
                         "n/a", "n/a");
    }
    for (const CacheStats& c : s.caches) {
      out += fmt::format("{:>12}{:>12}{:>12}{:>13}{:>16}{:>10}{:>12}{:>12}{:>6}\n",
                         s.session_id, c.cache_id, OrNa(c.mem_rows),
                         OrNa(c.disk_rows), OrNa(c.avg_row_bytes()),
                         OrNa(c.numa_hits), OrNa(c.hits), OrNa(c.misses),
                         c.full ? "yes" : "no");
    }
  }
  return out;
}

std::string SessionsJson(const std::vector<SessionInfo>& sessions) {
  std::string out = "[";
  bool first = true;
  for (const SessionInfo& s : sessions) {
    out += first ? "\n" : ",\n";
    first = false;
    out += fmt::format("  {{\"session\": {}, \"caches\": [", s.session_id);
    for (size_t i = 0; i < s.caches.size(); ++i) {
      const CacheStats& c = s.caches[i];
      out += fmt::format(
          "{}{{\"cache_id\": {}, \"name\": {}, \"mem_cached\": {}, "
          "\"mem_bytes\": {}, \"disk_cached\": {}, \"avg_cache_size\": {}, "
          "\"numa_hit\": {}, \"hits\": {}, \"misses\": {}, "
          "\"reserved_bytes\": {}, \"budget_bytes\": {}, \"full\": {}, "
          "\"disk_bytes\": {}, \"puts_full\": {}, \"spill_reads\": {}}}",
          i ? ", " : "", c.cache_id, JsonString(c.name), c.mem_rows, c.mem_bytes,
          c.disk_rows, c.avg_row_bytes(), c.numa_hits, c.hits, c.misses,
          c.reserved_bytes, c.budget_bytes, c.full ? "true" : "false",
          c.disk_bytes, c.puts_full, c.spill_reads);
    }
    out += "]}";
  }
  out += sessions.empty() ? "]\n" : "\n]\n";
  return out;
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

std::string ServerInfoTable(const ServerInfo& i) {
  std::string sessions;
  for (uint32_t s : i.sessions) sessions += (sessions.empty() ? "" : ", ") + std::to_string(s);
  return fmt::format(
      "Cache server configuration:\n"
      "  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n"
      "  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n  {:<18}{}\n"
      "  {:<18}{}\n  {:<18}{} ({} pages: {})\n"
      "Active sessions: {}\n",
      "Hostname:", "127.0.0.1", "Instance:", i.instance, "Socket:", i.socket_path,
      "Process id:", i.pid, "Workers:", i.workers, "Log level:", i.log_level,
      "Log file:", i.log_path, "Spill dir:", i.spill_dir.empty() ? "None" : i.spill_dir,
      "Memory cap:", MemoryLine(i),
      "NUMA nodes:", i.numa_nodes, "Shm dir:", i.shm_dir,
      i.shm_huge_pages ? "huge" : "4 KB", i.shm_pages,
      sessions.empty() ? "none" : sessions);
}

std::string ServerInfoJson(const ServerInfo& i) {
  std::string sessions;
  for (uint32_t s : i.sessions) sessions += (sessions.empty() ? "" : ", ") + std::to_string(s);
  return fmt::format(
      "{{\"hostname\": \"127.0.0.1\", \"port\": {}, \"socket\": {}, \"shm_dir\": {}, "
      "\"shm_huge_pages\": {}, \"shm_pages\": {}, \"pid\": {}, \"workers\": {}, \"log_level\": {}, \"log_file\": {}, "
      "\"spill_dir\": {}, \"memory_cap_bytes\": {}, \"memory_used_bytes\": {}, "
      "\"memory_held_bytes\": {}, \"numa_nodes\": {}, \"sessions\": [{}], "
      "\"connections\": {}, \"start_time_unix\": {}, \"uptime_seconds\": {:.3f}}}\n",
      i.port, JsonString(i.socket_path), JsonString(i.shm_dir),
      i.shm_huge_pages ? "true" : "false", JsonString(i.shm_pages), i.pid, i.workers,
      i.log_level, JsonString(i.log_path),
      i.spill_dir.empty() ? "null" : JsonString(i.spill_dir), i.memory_cap_bytes,
      i.memory_used_bytes, i.memory_held_bytes, i.numa_nodes, sessions, i.connections,
      i.start_time_unix, i.uptime_seconds);
}

}  // namespace shmcache::admin
