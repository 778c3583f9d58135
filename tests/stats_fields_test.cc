// kStatFields: the one description of CacheStats's fields that the wire
// codec, the metrics, the admin's table and JSON and the Python dict visit.
// Its names are unique and well formed in every output, each field is
// reached through the pointer its type says, and every field of CacheStats
// survives a listing's round trip (its bytes are pinned in
// protocol_messages_test's golden listing).
#include "format/stats_fields.h"

#include <regex>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "format/protocol_messages.h"

namespace shmcache {
namespace {

// A new member of CacheStats changes its size: add it to kStatFields (and
// to Distinct below), then update this figure. (libstdc++ on x86-64.)
static_assert(sizeof(CacheStats) == 8 + 32 + 11 * 8 + 8, "CacheStats changed");

// Every field of `c` set to a value of its own, through the table.
CacheStats Distinct() {
  CacheStats c;
  uint64_t v = 100;
  for (const StatField& f : kStatFields) {
    ++v;
    switch (f.type) {
      case StatType::kId: c.*f.id = static_cast<uint32_t>(v); break;
      case StatType::kText: c.*f.text = "text-" + std::to_string(v); break;
      case StatType::kCount: c.*f.count = v * 1000003; break;
      case StatType::kFlag: c.*f.flag = true; break;
      case StatType::kDerived: break;
    }
  }
  return c;
}

TEST(StatFieldsTest, EachFieldIsReachedThroughThePointerItsTypeSays) {
  for (const StatField& f : kStatFields) {
    SCOPED_TRACE(std::string(f.name));
    const int pointers = (f.id != nullptr) + (f.text != nullptr) + (f.count != nullptr) +
                         (f.flag != nullptr) + (f.derived != nullptr);
    EXPECT_EQ(pointers, 1);
    switch (f.type) {
      case StatType::kId: EXPECT_NE(f.id, nullptr); break;
      case StatType::kText: EXPECT_NE(f.text, nullptr); break;
      case StatType::kCount: EXPECT_NE(f.count, nullptr); break;
      case StatType::kFlag: EXPECT_NE(f.flag, nullptr); break;
      case StatType::kDerived:
        EXPECT_NE(f.derived, nullptr);
        EXPECT_FALSE(f.wire) << "derived values do not travel";
        break;
    }
  }
}

TEST(StatFieldsTest, NamesAreUniqueAndWellFormedInEveryOutput) {
  const std::regex metric_name("shmcache_cache_[a-z_]+");
  const std::regex key("[a-z_]+");
  std::set<std::string_view> names, json, metrics, titles;
  std::set<int> columns;
  for (const StatField& f : kStatFields) {
    SCOPED_TRACE(std::string(f.name));
    EXPECT_TRUE(names.insert(f.name).second);
    EXPECT_TRUE(std::regex_match(std::string(f.name), key));
    if (!f.json.empty()) {
      EXPECT_TRUE(json.insert(f.json).second);
      EXPECT_TRUE(std::regex_match(std::string(f.json), key));
    }
    if (!f.metric.empty()) {
      EXPECT_TRUE(metrics.insert(f.metric).second);
      EXPECT_TRUE(std::regex_match(std::string(f.metric), metric_name));
      EXPECT_TRUE(f.number()) << "a family's value is a number";
      EXPECT_FALSE(f.help.empty());
      // Prometheus: a counter's name ends in _total, a gauge's does not.
      EXPECT_EQ(f.counter, f.metric.ends_with("_total"));
    }
    if (f.column > 0) {
      EXPECT_TRUE(columns.insert(f.column).second);
      EXPECT_TRUE(titles.insert(f.title).second);
      EXPECT_GT(f.width, static_cast<int>(f.title.size())) << "a gap before the title";
    }
  }
  ASSERT_FALSE(columns.empty());
  EXPECT_EQ(*columns.begin(), 1);
  EXPECT_EQ(*columns.rbegin(), static_cast<int>(columns.size())) << "no gap in positions";
}

TEST(StatFieldsTest, NumbersAreTheMembersFlagsZeroOrOne) {
  CacheStats c = Distinct();
  c.mem_rows = 10;
  c.mem_bytes = 30;
  c.full = true;
  c.spills_now = false;
  auto number = [&c](std::string_view name) {
    for (const StatField& f : kStatFields) {
      if (f.name == name) return f.Number(c);
    }
    ADD_FAILURE() << name;
    return uint64_t{0};
  };
  EXPECT_EQ(number("mem_rows"), 10u);
  EXPECT_EQ(number("avg_row_bytes"), 3u);
  EXPECT_EQ(number("full"), 1u);
  EXPECT_EQ(number("spills_now"), 0u);
}

TEST(StatFieldsTest, EveryWireFieldSurvivesAListing) {
  CacheStats c = Distinct();
  c.session_id = 77;
  protocol::ListSessionsResponse listed;
  listed.sessions = {{.session_id = 77, .caches = {c}}};
  const std::string body = protocol::EncodeBody(listed);
  protocol::ListSessionsResponse back;
  ASSERT_TRUE(protocol::DecodeBody(
      {reinterpret_cast<const std::byte*>(body.data()), body.size()}, &back));
  ASSERT_EQ(back.sessions.size(), 1u);
  ASSERT_EQ(back.sessions[0].caches.size(), 1u);
  const CacheStats& got = back.sessions[0].caches[0];
  for (const StatField& f : kStatFields) {
    SCOPED_TRACE(std::string(f.name));
    switch (f.type) {
      case StatType::kId: EXPECT_EQ(got.*f.id, c.*f.id); break;
      case StatType::kText: EXPECT_EQ(got.*f.text, c.*f.text); break;
      default: EXPECT_EQ(f.Number(got), f.Number(c)); break;
    }
  }
  // The wire's fields: ids u32, text u32 + bytes, counters u64, flags u8;
  // the listing adds the session count, its id and its cache count.
  size_t bytes = 4 + 4 + 4;
  for (const StatField& f : kStatFields) {
    if (!f.wire) continue;
    bytes += f.type == StatType::kId      ? 4
             : f.type == StatType::kText  ? 4 + (c.*f.text).size()
             : f.type == StatType::kCount ? 8
                                          : 1;
  }
  EXPECT_EQ(body.size(), bytes);
}

}  // namespace
}  // namespace shmcache
