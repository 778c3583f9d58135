#include "common/process_identity.h"

#include <unistd.h>

#include <cctype>
#include <climits>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>

#include "format/parse_number.h"

namespace shmcache {

namespace {

// The field of /proc/PID/stat that holds the start (starttime, proc(5)).
constexpr int kStartField = 22;

std::string BootId() {
  std::string id;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), id);
  return id;
}

bool IsBootId(std::string_view text) {
  if (text.empty() || text.size() > 64) return false;
  for (const char c : text) {
    if (std::isxdigit(static_cast<unsigned char>(c)) == 0 && c != '-') return false;
  }
  return true;
}

}  // namespace

uint64_t ProcessStartTicks(int pid) {
  if (pid <= 0) return 0;
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  const std::string stat((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  // The name (field 2) is in parentheses and may hold anything, spaces and
  // ')' too: the fields after it are counted from its last ')'.
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) return 0;
  std::istringstream fields(stat.substr(name_end + 1));
  std::string field;
  for (int i = 3; i <= kStartField; ++i) {
    if (!(fields >> field)) return 0;
  }
  long ticks = 0;
  return ParseDecimal(field, 1, LONG_MAX, &ticks) ? static_cast<uint64_t>(ticks) : 0;
}

ProcessIdentity SelfIdentity() {
  ProcessIdentity self;
  self.pid = getpid();
  self.start_ticks = ProcessStartTicks(self.pid);
  self.boot_id = BootId();
  if (!IsBootId(self.boot_id)) self = ProcessIdentity{self.pid, 0, ""};
  return self;
}

std::string IdentityText(const ProcessIdentity& id) {
  if (!id.has_start()) return std::to_string(id.pid);
  return fmt::format("{} {} {}", id.pid, id.start_ticks, id.boot_id);
}

ProcessIdentity ParseIdentity(std::string_view line) {
  ProcessIdentity id;
  std::istringstream in{std::string(line)};
  std::string pid, start, boot;
  in >> pid >> start >> boot;
  long n = 0;
  if (!ParseDecimal(pid, 1, INT_MAX, &n)) return id;
  id.pid = static_cast<int>(n);
  if (ParseDecimal(start, 1, LONG_MAX, &n) && IsBootId(boot)) {
    id.start_ticks = static_cast<uint64_t>(n);
    id.boot_id = boot;
  }
  return id;
}

OwnerCheck CheckOwner(const ProcessHandle& held, const ProcessIdentity& recorded) {
  OwnerCheck check;
  if (recorded.pid <= 0 || held.pid() != recorded.pid) return check;
  if (recorded.has_start()) {
    // Unreadable here (a sandbox that hides it): the start alone decides.
    const std::string boot = BootId();
    if (!boot.empty() && recorded.boot_id != boot) {
      check.verdict = Ownership::kOtherBoot;
      return check;
    }
    // Read after the handle was opened: if the process it holds had ended
    // and the pid been given again, this is the later process's start.
    check.found_ticks = ProcessStartTicks(recorded.pid);
    if (check.found_ticks == 0) return check;  // gone
    if (check.found_ticks != recorded.start_ticks) {
      check.verdict = Ownership::kReplaced;
      return check;
    }
  }
  // Alive after its start was read: the handle holds the process read.
  if (held.Gone()) return check;
  check.verdict = recorded.has_start() ? Ownership::kOwner : Ownership::kUnrecorded;
  return check;
}

int PidStillNamed(const ProcessIdentity& recorded) {
  const Ownership is = CheckOwner(ProcessHandle(recorded.pid), recorded).verdict;
  return is == Ownership::kOwner || is == Ownership::kUnrecorded ? recorded.pid : 0;
}

}  // namespace shmcache
