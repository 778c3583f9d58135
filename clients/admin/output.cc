#include "clients/admin/output.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "format/stats_fields.h"

namespace shmcache::admin {
namespace {

// Keys in the order they are added: kStatFields' for a cache.
using Json = nlohmann::ordered_json;

// Indented by two; a cache name that is not UTF-8 has U+FFFD for its bad
// bytes (JSON text is UTF-8).
std::string Dump(const Json& j) {
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace

// The fields of kStatFields that are columns of the table, in column order.
static std::vector<const StatField*> TableColumns() {
  std::vector<const StatField*> columns;
  for (const StatField& f : kStatFields) {
    if (f.column > 0) columns.push_back(&f);
  }
  std::sort(columns.begin(), columns.end(),
            [](const StatField* a, const StatField* b) { return a->column < b->column; });
  return columns;
}

// A name's control characters as \n, \t or \xNN (and a backslash as
// two), so that a cache stays one line of the table.
static std::string Escaped(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if (ch == '\\') {
      out += "\\\\";
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (b < 0x20 || b == 0x7f) {
      out += fmt::format("\\x{:02x}", b);
    } else {
      out += ch;
    }
  }
  return out;
}

// A field's cell: a counter prints as the number it is, 0 included, as
// --json does; a flag as yes or no.
static std::string Cell(const StatField& f, const CacheStats& c) {
  if (f.type == StatType::kFlag) return c.*f.flag ? "yes" : "no";
  if (f.type == StatType::kId) return std::to_string(c.*f.id);
  if (f.type == StatType::kText) return Escaped(c.*f.text);
  return std::to_string(f.Number(c));
}

// Session and cache ids are random 32-bit numbers: 10 digits and a gap.
// "n/a" fills the row of a session that has no cache (no counters at all).
std::string SessionsTable(int port, const std::vector<SessionInfo>& sessions) {
  if (sessions.empty()) return "No active sessions.\n";
  constexpr int kSessionWidth = 12;
  const std::vector<const StatField*> columns = TableColumns();
  // Numbers right-aligned in their width; text (the name, last) after a
  // gap, as long as it is.
  auto line = [&](const std::string& session, auto&& cell) {
    std::string out = fmt::format("{:>{}}", session, kSessionWidth);
    for (const StatField* f : columns) {
      const std::string text = cell(*f);
      out += f->type == StatType::kText
                 ? std::string(f->width - f->title.size(), ' ') + text
                 : fmt::format("{:>{}}", text, f->width);
    }
    return out + "\n";
  };
  std::string out = fmt::format("Listing sessions for server on port {}\n\n", port);
  out += line("Session", [](const StatField& f) { return std::string(f.title); });
  for (const SessionInfo& s : sessions) {
    const std::string id = std::to_string(s.session_id);
    if (s.caches.empty())
      out += line(id, [](const StatField&) { return std::string("n/a"); });
    for (const CacheStats& c : s.caches) {
      out += line(id, [&c](const StatField& f) { return Cell(f, c); });
    }
  }
  return out;
}

std::string SessionsJson(const std::vector<SessionInfo>& sessions) {
  Json out = Json::array();
  for (const SessionInfo& s : sessions) {
    Json caches = Json::array();
    for (const CacheStats& c : s.caches) {
      Json cache = Json::object();
      for (const StatField& f : kStatFields) {
        if (f.json.empty()) continue;
        const std::string key(f.json);
        switch (f.type) {
          case StatType::kId: cache[key] = c.*f.id; break;
          case StatType::kText: cache[key] = c.*f.text; break;
          case StatType::kFlag: cache[key] = c.*f.flag; break;
          case StatType::kCount:
          case StatType::kDerived: cache[key] = f.Number(c); break;
        }
      }
      caches.push_back(std::move(cache));
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
