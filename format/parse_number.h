// Numbers read from text the way strtol(text, &end, base) and strtod read
// them, with std::from_chars: leading white space, an optional '+' or '-',
// then digits. from_chars alone takes neither the white space nor a '+';
// these add them, so that inputs accepted before stay accepted.
// Header-only: the daemon, the admin and the benchmarks use it as well as
// the library.
#pragma once

#include <cctype>
#include <charconv>
#include <limits>
#include <string_view>
#include <system_error>

namespace shmcache {

// The number at the front of `text` in `base`, as strtol (or strtoul,
// strtoull) gives it: *out is the number and ec errc{}, ptr past its last
// digit; or *out is 0 and ec invalid_argument when there is none (ptr:
// text.data()); or *out is the largest (smallest) Int and ec
// result_out_of_range when it does not fit. Unlike strtoul, an unsigned Int
// takes no '-'.
template <typename Int>
std::from_chars_result LeadingInteger(std::string_view text, Int* out, int base) {
  const char* p = text.data();
  const char* end = p + text.size();
  *out = 0;
  while (p < end && std::isspace(static_cast<unsigned char>(*p))) ++p;
  if (p < end && *p == '+') {
    ++p;
    if (p < end && *p == '-') return {text.data(), std::errc::invalid_argument};
  }
  std::from_chars_result r = std::from_chars(p, end, *out, base);
  if (r.ec == std::errc::invalid_argument) r.ptr = text.data();
  if (r.ec == std::errc::result_out_of_range) {
    *out = *p == '-' ? std::numeric_limits<Int>::min() : std::numeric_limits<Int>::max();
  }
  return r;
}

// The decimal number at the front of `text`, as strtol(text, &end, 10).
inline std::from_chars_result LeadingLong(std::string_view text, long* out) {
  return LeadingInteger(text, out, 10);
}

// True when the whole of `text` is one decimal number in [lo, hi]; it is
// then stored in *out.
inline bool ParseDecimal(std::string_view text, long lo, long hi, long* out) {
  long n = 0;
  std::from_chars_result r = LeadingLong(text, &n);
  if (r.ec != std::errc{} || r.ptr != text.data() + text.size() || n < lo || n > hi) {
    return false;
  }
  *out = n;
  return true;
}

// True when the whole of `text` is one floating-point number in the forms
// strtod reads in decimal (leading white space, '+' or '-', digits, '.',
// exponent; "inf", "nan"), stored in *out. Hexadecimal floats ("0x1p-1")
// are refused, and so is a number out of double's range.
inline bool ParseDouble(std::string_view text, double* out) {
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end && std::isspace(static_cast<unsigned char>(*p))) ++p;
  if (p < end && *p == '+') {
    ++p;
    if (p < end && *p == '-') return false;
  }
  double v = 0;
  std::from_chars_result r = std::from_chars(p, end, v);
  if (r.ec != std::errc{} || r.ptr != end) return false;
  *out = v;
  return true;
}

// What makes `text` no number as a person types one on a command line,
// though the readers above would take it: "" when nothing does; else "it is
// empty", "white space before it", "white space after it" or "a '+' sign".
// Option values are refused for these (' 12' read as 12 hid a quoting
// slip); the phrase goes into the refusal, which says what to give.
inline constexpr std::string_view kSpaceBefore = "white space before it";
inline constexpr std::string_view kSpaceAfter = "white space after it";
inline std::string_view TypedNumberFlaw(std::string_view text) {
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  if (text.empty()) return "it is empty";
  if (space(text.front())) return kSpaceBefore;
  if (space(text.back())) return kSpaceAfter;
  if (text.front() == '+') return "a '+' sign";
  return "";
}

}  // namespace shmcache
