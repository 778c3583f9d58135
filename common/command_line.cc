#include "common/command_line.h"

#include <algorithm>

#include <fmt/format.h>

namespace shmcache {
namespace {

// A value an option's check refused. Thrown through CLI11, which has no
// other way out of a callback, and caught in Parse: no exception leaves
// this file.
struct BadValue {
  Status status;
};

// The option name in one argument: "--name" of "--name=value", "-n" of
// "-nvalue", or "" when it is no option.
std::string NamePart(const std::string& arg) {
  if (arg.rfind("--", 0) == 0) return arg.substr(0, arg.find('='));
  if (arg.size() > 1 && arg[0] == '-') return arg.substr(0, 2);
  return "";
}

}  // namespace

CommandLine::CommandLine(const std::string& program, std::string hint)
    : app_(program), hint_(std::move(hint)) {
  app_.set_help_flag();
  app_.allow_extras();
}

CLI::Option* CommandLine::AddValue(const std::string& names,
                                   std::function<Status(const std::string&)> read) {
  auto callback = [read = std::move(read)](const std::string& v) {
    Status s = read(v);
    if (!s.ok()) throw BadValue{s};
  };
  return app_.add_option_function<std::string>(names, callback)
      ->trigger_on_parse()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

CLI::Option* CommandLine::AddFlag(const std::string& names) {
  return app_.add_flag(names);
}

// "--flag=value": refused, where CLI11 would read the value as true/false.
// "--option=" (nothing after '='): no value, where CLI11 would take the
// next word for it (`--spilldir= -p 5` read "-p" as the directory).
// "-p=5000": refused with how to write it, where the value was "=5000"
// ("port '=5000' is not a number"); so is "-start" (one dash before a long
// name). A word that is the value of the
// option before it ("-d" "-x=1") is not looked at.
Status CommandLine::CheckEqualsForms() const {
  bool is_value = false;
  for (size_t i = 1; i < argv_.size(); ++i) {
    const std::string& arg = argv_[i];
    const std::string name = NamePart(arg);
    const CLI::Option* o = name.empty() ? nullptr : app_.get_option_no_throw(name);
    const bool value_here = is_value;
    // The next word is this option's value when this one has none.
    is_value = o != nullptr && o->get_expected_max() > 0 && arg == name;
    // "-start": a long name after one dash (as Go's and Java's programs take
    // them). CLI11 read "-s" with the value "tart" ("spill directory 'tart'
    // is not an absolute path"), "-help" as the host "elp", "-generate_session"
    // as -g and an unknown "-enerate_session". No short option's value
    // collides: those are numbers and absolute paths.
    if (!value_here && arg.size() > 2 && arg[0] == '-' && arg[1] != '-' &&
        app_.get_option_no_throw(NamePart("-" + arg)) != nullptr) {
      return Status::InvalidArgument(
          fmt::format("{}: a long option takes two dashes; write '-{}'", arg, arg));
    }
    if (value_here || o == nullptr || arg.find('=') == std::string::npos) continue;
    if (arg.rfind("--", 0) != 0) {
      if (arg.size() < 3 || arg[2] != '=' || o->get_expected_max() == 0) continue;
      const std::string long_name = o->get_name();
      return Status::InvalidArgument(fmt::format(
          "{}: a short option takes its value after a space; write '{} {}'{}", arg, name,
          arg.substr(3),
          long_name == name ? "" : fmt::format(" or '{}={}'", long_name, arg.substr(3))));
    }
    if (o->get_expected_max() == 0) {
      return Status::InvalidArgument(fmt::format("{} takes no value", name));
    }
    if (arg.back() == '=') return NeedsValue(name, *o);
  }
  return Status::OK();
}

// A short name is told with its long one: `shmcache -h` is the host, not
// help, and the user should see which option took the word.
Status CommandLine::NeedsValue(const std::string& name, const CLI::Option& o) const {
  std::string shown = name;
  if (const std::string full = o.get_name(); full != name) {
    shown = fmt::format("{} ({})", name, full);
  }
  return Status::InvalidArgument(
      fmt::format("{} needs a value{}{}", shown, hint_.empty() ? "" : "; ", hint_));
}

// CLI11 finds an option short of its value only when the line ends there.
Status CommandLine::MissingValue(const CLI::ParseError& e) const {
  std::string name = argv_.size() > 1 ? NamePart(argv_.back()) : "";
  const CLI::Option* o = name.empty() ? nullptr : app_.get_option_no_throw(name);
  if (o == nullptr) return Status::InvalidArgument(e.what());
  return NeedsValue(name, *o);
}

Status CommandLine::Parse(const std::vector<std::string>& argv) {
  argv_ = argv;
  Status s = CheckEqualsForms();
  if (!s.ok()) return s;
  // CLI11 takes the arguments last first, without the program.
  std::vector<std::string> args(argv.rbegin(), argv.rend());
  if (!args.empty()) args.pop_back();
  try {
    app_.parse(args);
  } catch (const BadValue& e) {
    return e.status;
  } catch (const CLI::ArgumentMismatch& e) {
    return MissingValue(e);
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(e.what());
  }
  std::vector<std::string> extras = app_.remaining();
  if (extras.empty()) return Status::OK();
  const std::string& arg = extras.front();
  bool option = arg.size() > 1 && arg[0] == '-';
  return Status::InvalidArgument(
      fmt::format("{} '{}'{}; {}", option ? "unknown option" : "unexpected argument", arg,
                  option ? DidYouMean(arg) : "", hint_));
}

// " (did you mean --list_sessions?)" for "--list-sessions": the names
// have underscores, as MindSpore's cache_admin's; "" when no name is near.
std::string CommandLine::DidYouMean(const std::string& arg) const {
  std::string name = NamePart(arg);
  if (name.rfind("--", 0) != 0) return "";
  std::replace(name.begin() + 2, name.end(), '-', '_');
  if (name == NamePart(arg) || app_.get_option_no_throw(name) == nullptr) return "";
  return fmt::format(" (did you mean {}?)", name);
}

std::string CommandLine::AsWritten(const CLI::Option& option) const {
  for (size_t i = 1; i < argv_.size(); ++i) {
    std::string name = NamePart(argv_[i]);
    if (!name.empty() && option.check_name(name)) return name;
  }
  return option.get_name();
}

}  // namespace shmcache
