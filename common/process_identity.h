// A process named so that its name is never given to another one: its
// pid, when it started (field 22 of /proc/PID/stat, clock ticks since
// boot) and the boot it started in (/proc/sys/kernel/random/boot_id). A
// pid is given again once its process has ended (on a busy host pids
// wrap), and a run dir outlives a reboot; the three together are not, but
// for two processes given one pid within one clock tick (10 ms): a wrap of
// the pid space takes thousands of forks, and only root can choose a pid
// sooner (ns_last_pid, clone3's set_tid).
// Lock files record their holder so (instance_lock.h), and whatever signals
// or waits for a pid read from a file checks it first (CheckOwner).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/process_state.h"

namespace shmcache {

struct ProcessIdentity {
  int pid = 0;               // 0: none named
  uint64_t start_ticks = 0;  // 0: not recorded (an older version's file)
  std::string boot_id;       // "": not recorded
  bool has_start() const { return start_ticks != 0; }
};

// This process's identity; its start is not recorded where /proc cannot
// be read.
ProcessIdentity SelfIdentity();

// The start of the process that has `pid` now, in clock ticks since boot;
// 0 when there is none (or /proc cannot be read).
uint64_t ProcessStartTicks(int pid);

// The text a file records an identity in, one line without its newline:
// "PID START BOOT_ID", or "PID" alone when the start is not known (what
// versions before the start was recorded wrote, and still read: they take
// the leading number).
std::string IdentityText(const ProcessIdentity& id);
// The identity in such a line; pid 0 when it names none (not a number, out
// of range), and no start when the start or boot id is missing or
// malformed.
ProcessIdentity ParseIdentity(std::string_view line);

// What a process held by a handle is to the identity a file recorded.
enum class Ownership {
  kOwner,       // the very process: signalling or waiting for it is safe
  kUnrecorded,  // the file records no start (an older version's): unknown
  kGone,        // no process has the pid, or it has exited
  kOtherBoot,   // recorded before the last boot: the pid is another's now
  kReplaced,    // the process with the pid started at another time
};
struct OwnerCheck {
  Ownership verdict = Ownership::kGone;
  uint64_t found_ticks = 0;  // the start of the process with the pid (kReplaced)
};

// Whether `held`, opened for recorded.pid BEFORE this call, is the process
// `recorded` names. The start is read after the handle was opened, and the
// handle is seen not to have exited after that: a kOwner handle holds the
// recorded process itself, so a signal sent or a wait made through it is
// about the process checked (where the handle has no pidfd, the pid may
// still be given again between the check and its use).
OwnerCheck CheckOwner(const ProcessHandle& held, const ProcessIdentity& recorded);

// recorded.pid while that process runs (kOwner; kUnrecorded, an older
// version's record, is taken at its word as before), else 0. For messages
// only: what is signalled is checked through the handle it is sent by.
int PidStillNamed(const ProcessIdentity& recorded);

}  // namespace shmcache
