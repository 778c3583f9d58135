#include "format/shell_quote.h"

#include <algorithm>
#include <string_view>

namespace shmcache {

static bool Literal(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
    return true;
  }
  static constexpr std::string_view kSafe = "@%+=:,./_-";
  return kSafe.find(c) != std::string_view::npos;
}

std::string ShellQuote(const std::string& word) {
  if (!word.empty() && std::all_of(word.begin(), word.end(), Literal)) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\"'\"'";
    } else {
      out += c;
    }
  }
  out += '\'';
  return out;
}

}  // namespace shmcache
