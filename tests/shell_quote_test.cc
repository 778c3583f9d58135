// ShellQuote (format/shell_quote.h): a run dir in a suggested command
// pastes as one word; a plain one is printed as it was.
#include "format/shell_quote.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

// What /bin/sh makes of `quoted` as one argument of printf.
std::string ShellReads(const std::string& quoted) {
  const std::string command = "printf '%s|' " + quoted;
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return "popen failed";
  std::string out;
  char buf[256];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  pclose(f);
  return out;
}

TEST(ShellQuoteTest, APlainPathIsPrintedAsItIs) {
  EXPECT_EQ(ShellQuote("/tmp/shmcache-1000"), "/tmp/shmcache-1000");
  EXPECT_EQ(ShellQuote("/a/b_c.d@e%f+g=h:i,j"), "/a/b_c.d@e%f+g=h:i,j");
}

TEST(ShellQuoteTest, ThePasteIsOneWordTheShellReadsBackExactly) {
  for (const std::string word : {"/tmp/my dir", "/tmp/it's", "", "/tmp/$HOME`x`\\",
                                 "/tmp/a\"b", "/tmp/*", "/tmp/new\nline", "'"}) {
    const std::string quoted = ShellQuote(word);
    EXPECT_NE(quoted, word);
    EXPECT_EQ(ShellReads(quoted), word + "|") << quoted;
  }
  EXPECT_EQ(ShellQuote("/tmp/my dir"), "'/tmp/my dir'");
}

}  // namespace
}  // namespace shmcache
