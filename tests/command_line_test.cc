// CommandLine (CLI11 in shmcache's words): every problem is one line in the
// words the admin has always used. (The ServerFlags both binaries read with
// it: server_flags_test.cc.)
#include "common/command_line.h"

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/option_checks.h"

namespace shmcache {
namespace {

// A program with flags (--json, -g, --dry_run), a checked number (-n) and a
// text.
struct Program {
  Program() : cl("prog", "see 'prog --help'") {
    json = cl.AddFlag("--json");
    gen = cl.AddFlag("-g,--generate");
    cl.AddFlag("--dry_run");
    number = cl.AddValue("-n,--number", [this](const std::string& v) {
      return ParseInRange("number", v, 1, 9, &n);
    });
    cl.AddValue("--text", [this](const std::string& v) {
      text = v;
      return Status::OK();
    });
  }
  Status Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    return cl.Parse(args);
  }

  CommandLine cl;
  CLI::Option* json;
  CLI::Option* gen;
  CLI::Option* number;
  long n = 0;
  std::string text;
};

std::string Why(const Status& s) { return s.ok() ? "OK" : s.message(); }

TEST(CommandLineTest, ValuesInEveryForm) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"-n", "3"}, {"--number", "3"}, {"--number=3"}, {"-n3"}}) {
    Program p;
    EXPECT_EQ(Why(p.Parse(args)), "OK") << args[0];
    EXPECT_EQ(p.n, 3) << args[0];
  }
  Program p;
  ASSERT_TRUE(p.Parse({"--json", "--text", "-x-", "-g"}).ok());
  EXPECT_EQ(p.json->count(), 1u);
  EXPECT_EQ(p.gen->count(), 1u);
  EXPECT_EQ(p.text, "-x-") << "a value may start with '-'";
  Program q;
  ASSERT_EQ(Why(q.Parse({"--text", "-n=3"})), "OK");
  EXPECT_EQ(q.text, "-n=3") << "a value that looks like \"-n=value\" is a value";
}

TEST(CommandLineTest, TheLastOfARepeatedOptionCounts) {
  Program p;
  ASSERT_TRUE(p.Parse({"-n", "3", "--number=5"}).ok());
  EXPECT_EQ(p.n, 5);
}

TEST(CommandLineTest, ProblemsInTheProgramsWords) {
  auto why = [](std::vector<std::string> args) {
    return Why(Program().Parse(std::move(args)));
  };
  EXPECT_EQ(why({"--bogus"}), "unknown option '--bogus'; see 'prog --help'");
  EXPECT_EQ(why({"-x"}), "unknown option '-x'; see 'prog --help'");
  // Hyphens for the underscores of the names (--list-sessions for
  // --list_sessions): the name meant is said.
  EXPECT_EQ(why({"--dry-run"}),
            "unknown option '--dry-run' (did you mean --dry_run?); see 'prog --help'");
  EXPECT_EQ(why({"--dry-run=3"}),
            "unknown option '--dry-run=3' (did you mean --dry_run?); see 'prog --help'");
  EXPECT_EQ(why({"--json", "stray"}), "unexpected argument 'stray'; see 'prog --help'");
  EXPECT_EQ(why({"--json", "-n"}), "-n (--number) needs a value; see 'prog --help'");
  EXPECT_EQ(why({"--number"}), "--number needs a value; see 'prog --help'");
  // "--name=" is no value, wherever it stands: CLI11 took the next word
  // for it ("spill directory '-p' is not an absolute path").
  EXPECT_EQ(why({"--number="}), "--number needs a value; see 'prog --help'");
  EXPECT_EQ(why({"--number=", "--json"}), "--number needs a value; see 'prog --help'");
  EXPECT_EQ(why({"--text=", "-n", "3"}), "--text needs a value; see 'prog --help'");
  EXPECT_EQ(why({"--json=yes"}), "--json takes no value");
  EXPECT_EQ(why({"--generate=1"}), "--generate takes no value");
  // "-n=3" was the value "=3" ("number '=3' is not a number").
  EXPECT_EQ(why({"-n=3"}),
            "-n=3: a short option takes its value after a space; write '-n 3' or "
            "'--number=3'");
  EXPECT_EQ(why({"-n", "0"}), "number '0' is not a number in 1..9");
  // The first bad value on the line is the one told.
  EXPECT_EQ(why({"-n", "x", "--number", "y"}), "number 'x' is not a number in 1..9");
  // No help flag of CLI11's own.
  EXPECT_EQ(why({"-h"}), "unknown option '-h'; see 'prog --help'");
  EXPECT_EQ(why({"--help"}), "unknown option '--help'; see 'prog --help'");
}

// A long name after one dash ("-number", as Go's and Java's programs take
// them) is told to take two: CLI11 read "-number" as -n with the value
// "umber", "-generate" as -g and an unknown "-enerate". A value that looks
// like one is still a value, and a short option's own value still follows it.
TEST(CommandLineTest, ALongNameAfterOneDashIsToldToTakeTwo) {
  auto why = [](std::vector<std::string> args) {
    return Why(Program().Parse(std::move(args)));
  };
  EXPECT_EQ(why({"-number", "3"}),
            "-number: a long option takes two dashes; write '--number'");
  EXPECT_EQ(why({"-number=3"}),
            "-number=3: a long option takes two dashes; write '--number=3'");
  EXPECT_EQ(why({"-generate"}),
            "-generate: a long option takes two dashes; write '--generate'");
  EXPECT_EQ(why({"--json", "-dry_run"}),
            "-dry_run: a long option takes two dashes; write '--dry_run'");
  EXPECT_EQ(why({"--text", "-json"}), "OK") << "a value";
  EXPECT_EQ(why({"-n3", "--text", "-generate"}), "OK");
  EXPECT_EQ(why({"-nothing"}), "number 'othing' is not a number in 1..9")
      << "no such name";
}

TEST(CommandLineTest, OptionsAsWritten) {
  Program p;
  ASSERT_TRUE(p.Parse({"--json", "-n", "4", "--generate"}).ok());
  EXPECT_EQ(p.cl.AsWritten(*p.number), "-n");
  EXPECT_EQ(p.cl.AsWritten(*p.gen), "--generate");
  ASSERT_EQ(p.cl.given().size(), 3u);
  EXPECT_EQ(p.cl.given()[0], p.json) << "in the order of the line";
  EXPECT_EQ(p.cl.given()[2], p.gen);
}

}  // namespace
}  // namespace shmcache
