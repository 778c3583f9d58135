#include "daemon/peer_processes.h"

#include <algorithm>

namespace shmcache {

std::shared_ptr<const ProcessHandle> PeerProcesses::Hold(pid_t pid) {
  auto it = held_.find(pid);
  if (it != held_.end()) {
    // Still running means still the same process: a pid is given again
    // only once its process is gone.
    if (auto handle = it->second.lock(); handle && !handle->Gone()) return handle;
  }
  auto handle = std::make_shared<const ProcessHandle>(pid);
  held_[pid] = handle;
  if (held_.size() >= prune_at_) {
    std::erase_if(held_, [](const auto& entry) { return entry.second.expired(); });
    // Amortised: prune again once the map has doubled.
    prune_at_ = std::max<size_t>(64, 2 * held_.size());
  }
  return handle;
}

size_t PeerProcesses::size() const {
  size_t n = 0;
  for (const auto& [pid, handle] : held_) n += !handle.expired();
  return n;
}

}  // namespace shmcache
