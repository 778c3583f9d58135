// Integers read from text the way strtol(text, &end, base) reads them,
// with std::from_chars: leading white space, an optional '+' or '-', then
// digits. from_chars alone takes neither the white space nor a '+'; these
// add them, so that inputs accepted before stay accepted. Header-only: the
// daemon and the admin use it as well as the library.
#pragma once

#include <cctype>
#include <charconv>
#include <climits>
#include <string_view>
#include <system_error>

namespace shmcache {

// The decimal number at the front of `text`, as strtol gives it: *out is
// the number and ec errc{}, ptr past its last digit; or *out is 0 and ec
// invalid_argument when there is none (ptr: text.data()); or *out is
// LONG_MAX or LONG_MIN and ec result_out_of_range when it does not fit.
inline std::from_chars_result LeadingLong(std::string_view text, long* out) {
  const char* p = text.data();
  const char* end = p + text.size();
  *out = 0;
  while (p < end && std::isspace(static_cast<unsigned char>(*p))) ++p;
  if (p < end && *p == '+') {
    ++p;
    if (p < end && *p == '-') return {text.data(), std::errc::invalid_argument};
  }
  std::from_chars_result r = std::from_chars(p, end, *out, 10);
  if (r.ec == std::errc::invalid_argument) r.ptr = text.data();
  if (r.ec == std::errc::result_out_of_range) *out = *p == '-' ? LONG_MIN : LONG_MAX;
  return r;
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

}  // namespace shmcache
