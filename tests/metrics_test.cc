// PrometheusText: the exposition format's rules (families, label escaping,
// UTF-8) for names a cache may have. The output is also parsed by Debian's
// prometheus_client in tests/python/test_metrics.py.
#include "common/metrics.h"

#include <string>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

TEST(MetricsTest, LabelValuesAreEscaped) {
  EXPECT_EQ(PrometheusLabelValue("plain"), "plain");
  EXPECT_EQ(PrometheusLabelValue("a\"b"), "a\\\"b");
  EXPECT_EQ(PrometheusLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(PrometheusLabelValue("a\nb"), "a\\nb");
  EXPECT_EQ(PrometheusLabelValue("caf\xC3\xA9 \xE2\x82\xAC"), "caf\xC3\xA9 \xE2\x82\xAC");
}

TEST(MetricsTest, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(PrometheusLabelValue("a\xFF"
                                 "b"),
            "a" + fffd + "b");
  EXPECT_EQ(PrometheusLabelValue("\xC3"), fffd);                        // truncated
  EXPECT_EQ(PrometheusLabelValue("\xC0\xAF"), fffd + fffd);             // overlong
  EXPECT_EQ(PrometheusLabelValue("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(PrometheusLabelValue("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);
}

TEST(MetricsTest, EachFamilyOnceWithEveryCache) {
  ServerInfo info;
  info.port = 50052;
  info.memory_used_bytes = 1 << 20;
  info.memory_held_bytes = 4096;
  info.sessions = {7, 8};
  std::vector<SessionInfo> sessions(2);
  sessions[0].session_id = 7;
  sessions[1].session_id = 8;
  CacheStats a, b;
  a.cache_id = 1;
  a.name = "train";
  a.hits = 5;
  b.cache_id = 2;
  b.name = "val\"x";
  b.hits = 6;
  b.full = true;
  sessions[0].caches = {a};
  sessions[1].caches = {b};
  std::string text = PrometheusText(info, sessions);

  auto count = [&](const std::string& s) {
    size_t n = 0;
    for (size_t p = text.find(s); p != std::string::npos; p = text.find(s, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("# TYPE shmcache_cache_hits_total counter\n"), 1u);
  EXPECT_EQ(count("# TYPE shmcache_server_sessions gauge\n"), 1u);
  EXPECT_EQ(count("shmcache_server_sessions{port=\"50052\"} 2\n"), 1u);
  EXPECT_EQ(count("shmcache_server_caches{port=\"50052\"} 2\n"), 1u);
  EXPECT_EQ(count("shmcache_server_memory_used_bytes{port=\"50052\"} 1048576\n"), 1u);
  EXPECT_EQ(count("shmcache_server_memory_held_bytes{port=\"50052\"} 4096\n"), 1u);
  EXPECT_EQ(
      count("shmcache_cache_hits_total{port=\"50052\",session=\"7\",cache=\"train\","
            "cache_id=\"1\"} 5\n"),
      1u);
  EXPECT_EQ(
      count("shmcache_cache_hits_total{port=\"50052\",session=\"8\",cache=\"val\\\"x\","
            "cache_id=\"2\"} 6\n"),
      1u);
  EXPECT_EQ(count("shmcache_cache_full{port=\"50052\",session=\"8\",cache=\"val\\\"x\","
                  "cache_id=\"2\"} 1\n"),
            1u);
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace shmcache
