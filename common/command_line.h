// CommandLine: a command line read with CLI11, in shmcache's words. CLI11
// finds the options and their values; the values are read and checked by
// the program (with option_checks.h); every problem becomes one
// InvalidArgument line:
//   unknown option '--x'; <hint>        unexpected argument 'x'; <hint>
//   -p needs a value                    --json takes no value
// or the message of the option's own check. A value is given as
// "--name=value", "--name value" or "-n value" ("-n=value" is refused with
// how to write it); when an option is given
// twice, the last one counts. CLI11's own help flag is left out: -h may be
// an option of the program.
//
// Not thread-safe; one object per command line.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "shmcache/status.h"

namespace shmcache {

class CommandLine {
 public:
  // `hint` ends the messages about unknown options and stray arguments
  // (e.g. "see 'shmcache --help'").
  CommandLine(const std::string& program, std::string hint);

  // An option of one value (`names` as CLI11 takes them: "-w,--workers")
  // whose text `read` checks and stores. `read` runs as the option is met,
  // so the first bad value on the line is the one reported.
  CLI::Option* AddValue(const std::string& names,
                        std::function<Status(const std::string&)> read);
  // An option without a value; count() says whether it was given.
  CLI::Option* AddFlag(const std::string& names);

  // Reads argv (argv[0] is the program) into the options added.
  Status Parse(const std::vector<std::string>& argv);

  // The options given, in the order they appear on the line (an option
  // given twice is there twice).
  const std::vector<CLI::Option*>& given() const { return app_.parse_order(); }
  // `option` as the user wrote it first ("-w" or "--workers"), for messages.
  std::string AsWritten(const CLI::Option& option) const;

 private:
  Status CheckEqualsForms() const;
  Status NeedsValue(const std::string& name, const CLI::Option& option) const;
  Status MissingValue(const CLI::ParseError& e) const;
  std::string DidYouMean(const std::string& arg) const;

  CLI::App app_;
  std::string hint_;
  std::vector<std::string> argv_;
};

}  // namespace shmcache
