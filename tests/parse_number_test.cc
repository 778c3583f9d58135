// parse_number.h reads numbers as strtol did at the sites it replaced: the
// same inputs accepted with the same values, the same refused.
#include "format/parse_number.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

// A table, packed by hand: clang-format would put one input per line.
// clang-format off
const char* const kInputs[] = {
    "", " ", "0", "-0", "+0", "42", " 42", "\t\n42", "+42", "-42", "042",
    "42 ", "42x", "x42", "4 2", "+", "-", "+-5", "-+5", "--5", "++5", "- 5",
    "0x10", "1e3", "65535", "65536", "1025", "9223372036854775807",
    "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
    "99999999999999999999999", "-99999999999999999999999", "1234\n"};
// clang-format on

// What the replaced code did: strtol with an end check, errno and range.
bool OldParse(const std::string& v, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || n < lo || n > hi) return false;
  *out = n;
  return true;
}

TEST(ParseNumberTest, ParseDecimalAcceptsWhatStrtolAccepted) {
  for (const char* in : kInputs) {
    for (auto [lo, hi] :
         {std::pair{LONG_MIN, LONG_MAX}, std::pair{1025L, 65535L}, std::pair{0L, 4L}}) {
      long want = -7, got = -7;
      EXPECT_EQ(ParseDecimal(in, lo, hi, &got), OldParse(in, lo, hi, &want))
          << "'" << in << "' in " << lo << ".." << hi;
      EXPECT_EQ(got, want) << "'" << in << "'";
    }
  }
}

TEST(ParseNumberTest, LeadingLongGivesWhatStrtolGave) {
  for (const char* in : kInputs) {
    long got = -7;
    LeadingLong(in, &got);
    EXPECT_EQ(got, std::strtol(in, nullptr, 10)) << "'" << in << "'";
  }
}

TEST(ParseNumberTest, LeadingHexGivesWhatStrtoullGave) {
  // /proc/self/status's CapEff line, after "CapEff:".
  for (const char* in : {"\t000001ffffffffff", " 0", "ff\n", "  a0000x", "zz", "",
                         "ffffffffffffffff", "10000000000000000"}) {
    uint64_t got = 7;
    LeadingInteger(std::string_view(in), &got, 16);
    EXPECT_EQ(got, std::strtoull(in, nullptr, 16)) << "'" << in << "'";
  }
}

TEST(ParseNumberTest, ParseDoubleAcceptsWhatStrtodAcceptedInDecimal) {
  for (const char* in : {"0.5", " 0.5", "+0.5", "-0.5", "1", "1e-300", ".25", "5.", "1E2",
                         "0.5x", "", " ", "+-1", "x", "0.5 ", "nan", "inf"}) {
    char* end = nullptr;
    double want = std::strtod(in, &end);
    bool want_ok = *in != '\0' && *end == '\0' && end != in;
    double got = -7;
    EXPECT_EQ(ParseDouble(in, &got), want_ok) << "'" << in << "'";
    if (want_ok && !std::isnan(want)) {
      EXPECT_EQ(got, want) << "'" << in << "'";
    }
  }
  double got = -7;
  EXPECT_FALSE(ParseDouble("0x1p-1", &got)) << "hexadecimal floats are refused";
  EXPECT_FALSE(ParseDouble("1e999", &got)) << "out of range";
}

}  // namespace
}  // namespace shmcache
