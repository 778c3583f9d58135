// PeerProcesses: the client processes at the other end of the control
// socket, each held once (a ProcessHandle, so a pidfd) however many
// connections it opens. A trainer's loader workers each connect, and a
// descriptor per connection would halve how many clients a daemon near its
// open-files limit can serve.
//
// Not thread-safe: the accept chain alone calls Hold. The handles it gives
// out may be used and dropped on any thread.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>

#include "common/process_state.h"

namespace shmcache {

class PeerProcesses {
 public:
  // The process `pid` that has just connected (SO_PEERCRED). The handle
  // already held for it when that process still runs, else a new one: a
  // held process that is gone gave its pid to this one.
  std::shared_ptr<const ProcessHandle> Hold(pid_t pid);

  // Processes with a handle still in use.
  size_t size() const;
  // Entries kept, counting handles dropped since the last pruning: stays
  // within twice size() plus 64, however many processes came and went.
  size_t tracked() const { return held_.size(); }

 private:
  std::map<pid_t, std::weak_ptr<const ProcessHandle>> held_;
  size_t prune_at_ = 64;
};

}  // namespace shmcache
