#include "common/metrics.h"

#include <cstdint>
#include <iterator>

#include <fmt/format.h>

#include "format/stats_fields.h"
#include "shmcache/version.h"

namespace shmcache {
namespace {

void Family(std::string& out, std::string_view name, std::string_view type,
            std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help,
                 name, type);
}

void SampleStart(std::string& out, std::string_view name, std::string_view labels) {
  out.append(name);
  out.push_back('{');
  out.append(labels);
  out.append("} ");
}

// Integers through format_int: 12 families of 1,000 caches are most of the
// text, and `shmcache --metrics` should cost a few milliseconds.
void Sample(std::string& out, std::string_view name, std::string_view labels,
            uint64_t value) {
  SampleStart(out, name, labels);
  fmt::format_int digits(value);
  out.append(digits.data(), digits.size());
  out.push_back('\n');
}

void Sample(std::string& out, std::string_view name, std::string_view labels,
            double value) {
  SampleStart(out, name, labels);
  fmt::format_to(std::back_inserter(out), "{}\n", value);
}

// Length of the UTF-8 sequence at s[i], or 0 when it is not valid UTF-8.
size_t Utf8Length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b = byte(i);
  if (b < 0x80) return 1;
  size_t n = b >= 0xC2 && b <= 0xDF   ? 2
             : b >= 0xE0 && b <= 0xEF ? 3
             : b >= 0xF0 && b <= 0xF4 ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  unsigned char c = byte(i + 1);  // no overlong forms, surrogates, > U+10FFFF
  if ((b == 0xE0 && c < 0xA0) || (b == 0xED && c > 0x9F) || (b == 0xF0 && c < 0x90) ||
      (b == 0xF4 && c > 0x8F)) {
    return 0;
  }
  return n;
}

}  // namespace

std::string PrometheusLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size();) {
    char c = v[i];
    size_t n = Utf8Length(v, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += 1;
      continue;
    }
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out.append(v.substr(i, n));
    i += n;
  }
  return out;
}

std::string PrometheusText(const ServerInfo& info,
                           const std::vector<SessionInfo>& sessions) {
  std::string out;
  std::string port = fmt::format("port=\"{}\"", info.port);
  size_t num_caches = 0;
  for (const SessionInfo& s : sessions) num_caches += s.caches.size();

  Family(out, "shmcache_server_info", "gauge",
         "The server's configuration, as labels; the value is always 1.");
  Sample(out, "shmcache_server_info",
         fmt::format("{},version=\"{}.{}.{}\",shm_dir=\"{}\",spill_dir=\"{}\"", port,
                     kMajorVersion, kMinorVersion, kPatchVersion,
                     PrometheusLabelValue(info.shm_dir),
                     PrometheusLabelValue(info.spill_dir)),
         uint64_t{1});
  struct ServerMetric {
    const char* name;
    const char* help;
    double value;
  };
  const ServerMetric server[] = {
      {"shmcache_server_memory_used_bytes", "Shared memory reserved by all caches.",
       static_cast<double>(info.memory_used_bytes)},
      {"shmcache_server_memory_cap_bytes", "The most all caches together may reserve.",
       static_cast<double>(info.memory_cap_bytes)},
      {"shmcache_server_memory_held_bytes",
       "Part of memory used: destroyed sessions' memory that processes still map.",
       static_cast<double>(info.memory_held_bytes)},
      {"shmcache_server_sessions", "Sessions.",
       static_cast<double>(info.sessions.size())},
      {"shmcache_server_caches", "Caches in all sessions.",
       static_cast<double>(num_caches)},
      {"shmcache_server_connections", "Client connections open now.",
       static_cast<double>(info.connections)},
      {"shmcache_server_uptime_seconds", "Seconds since the server started.",
       info.uptime_seconds},
      {"shmcache_server_start_time_seconds",
       "When the server started, in seconds since the Unix epoch.",
       static_cast<double>(info.start_time_unix)},
  };
  for (const ServerMetric& m : server) {
    Family(out, m.name, "gauge", m.help);
    Sample(out, m.name, port, m.value);
  }
  // Each bound of the cap (a cgroup without a limit has none), and which
  // one applies: 1 for it, 0 for the others.
  struct Bound {
    const std::string& name;
    uint64_t bytes;
  };
  const std::string cgroup = "cgroup", shm = "shm_filesystem";
  const Bound bounds[] = {{info.memory_requested_bound, info.memory_requested_bytes},
                          {cgroup, info.memory_cgroup_bytes},
                          {shm, info.memory_shm_bytes}};
  Family(out, "shmcache_server_memory_cap_bound_bytes", "gauge",
         "Each bound the memory cap is the smallest of, by name.");
  for (const Bound& b : bounds) {
    if (b.name.empty() || (b.bytes == 0 && &b.name == &cgroup)) continue;
    Sample(out, "shmcache_server_memory_cap_bound_bytes",
           fmt::format("{},bound=\"{}\"", port, PrometheusLabelValue(b.name)),
           static_cast<double>(b.bytes));
  }
  Family(out, "shmcache_server_memory_cap_bound_applies", "gauge",
         "1 for the bound that sets the memory cap, 0 for the others.");
  for (const Bound& b : bounds) {
    if (b.name.empty() || (b.bytes == 0 && &b.name == &cgroup)) continue;
    Sample(out, "shmcache_server_memory_cap_bound_applies",
           fmt::format("{},bound=\"{}\"", port, PrometheusLabelValue(b.name)),
           uint64_t{b.name == info.memory_cap_bound ? 1u : 0u});
  }

  // Label sets are built once; each family then repeats them.
  std::vector<std::string> labels;
  std::vector<const CacheStats*> caches;
  labels.reserve(num_caches);
  caches.reserve(num_caches);
  size_t label_bytes = 0;
  for (const SessionInfo& s : sessions) {
    for (const CacheStats& c : s.caches) {
      labels.push_back(fmt::format("{},session=\"{}\",cache=\"{}\",cache_id=\"{}\"", port,
                                   s.session_id, PrometheusLabelValue(c.name),
                                   c.cache_id));
      label_bytes += labels.back().size();
      caches.push_back(&c);
    }
  }
  // One allocation for the text (megabytes with 1,000 caches): growing
  // it would copy and fault in several times that.
  size_t size = out.size();
  // One family per field of kStatFields that has a metric, in its order;
  // --list_sessions shows the same fields.
  for (const StatField& f : kStatFields) {
    if (!f.metric.empty())
      size += 256 + label_bytes + num_caches * (f.metric.size() + 4 + 20);
  }
  out.reserve(size);
  for (const StatField& f : kStatFields) {
    if (f.metric.empty()) continue;
    Family(out, f.metric, f.counter ? "counter" : "gauge", f.help);
    for (size_t i = 0; i < caches.size(); ++i) {
      Sample(out, f.metric, labels[i], f.Number(*caches[i]));
    }
  }
  return out;
}

}  // namespace shmcache
