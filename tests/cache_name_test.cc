// The cache name rule: lengths, and UTF-8 as strict decoders (Python's)
// accept it.
#include "format/cache_name.h"

#include <string>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

TEST(CacheNameTest, WellFormedUtf8IsAccepted) {
  using Strings = std::initializer_list<std::string>;
  for (const std::string& ok :
       Strings{"", "train", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
               "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf", std::string("a\0b", 3)}) {
    EXPECT_TRUE(IsValidUtf8(ok)) << testing::PrintToString(ok);
  }
}

TEST(CacheNameTest, MalformedUtf8IsRefused) {
  for (const std::string& bad : std::initializer_list<std::string>{
           "\xff", "\x80", "abc\xbf",                       // not a lead byte
           "\xc3", "\xe2\x82", "\xf0\x9f\x98",              // truncated
           "\xc3\x28", "\xe2\x28\xac",                      // bad continuation
           "\xc0\xaf", "\xe0\x80\xaf", "\xf0\x80\x80\xaf",  // overlong
           "\xed\xa0\x80", "\xed\xbf\xbf",                  // surrogates
           "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80",      // above U+10FFFF
       }) {
    EXPECT_FALSE(IsValidUtf8(bad)) << testing::PrintToString(bad);
  }
}

TEST(CacheNameTest, CheckCacheNameNamesTheRule) {
  EXPECT_TRUE(CheckCacheName("train", "").ok());
  EXPECT_TRUE(CheckCacheName(std::string(255, 'n'), std::string(255, 'f')).ok());
  EXPECT_TRUE(CheckCacheName("", "fp").IsInvalidArgument());
  EXPECT_TRUE(CheckCacheName(std::string(256, 'n'), "").IsInvalidArgument());
  EXPECT_TRUE(CheckCacheName("n", std::string(256, 'f')).IsInvalidArgument());
  Status s = CheckCacheName("n\xff", "fp");
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("UTF-8"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckCacheName("n", "\xed\xa0\x80").IsInvalidArgument());
}

}  // namespace
}  // namespace shmcache
