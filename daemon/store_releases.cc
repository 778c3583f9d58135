// Releasing the chunks of a connection that ended: at once when its process
// is gone, else retried until it is or the grace period ends (a process that
// lives on keeps writing into its chunks).

#include "daemon/store.h"

#include "common/process_state.h"
#include "daemon/logger.h"

namespace shmcache {

void Store::ReleaseConnection(uint64_t conn,
                              std::shared_ptr<const ProcessHandle> process) {
  // Its staging files go at once: what it staged and did not send is not
  // in the index, live process or not.
  stages_.Release(conn);
  MutexLock lock(&mu_);
  if (process == nullptr || process->Gone()) {
    for (auto& [id, c] : caches_) c->ReleaseConnection(conn, true);
    return;
  }
  // Either the process is in the middle of exiting, or its connection broke
  // while it lives on and may still write into its chunks.
  pending_releases_.push_back(
      {conn, std::move(process), std::chrono::steady_clock::now() + kReleaseGrace});
  jobs_cv_.SignalAll();  // the first preparer retries it
}

void Store::RetryReleasesLocked() {
  auto now = std::chrono::steady_clock::now();
  std::erase_if(pending_releases_, [&](const PendingRelease& p) REQUIRES(mu_) {
    bool gone = p.process->Gone();
    if (!gone && now < p.deadline) return false;
    if (!gone) WarnChunksStayLocked(p.process->pid());
    for (auto& [id, c] : caches_) c->ReleaseConnection(p.conn, gone);
    return true;
  });
}

void Store::WarnChunksStayLocked(int pid) {
  // A process that opens and drops caches by the thousand must not flood
  // the log: one line per process.
  if (warned_pids_.count(pid)) return;
  if (warned_pids_.size() >= kMaxWarnedPids) {
    std::erase_if(warned_pids_, [](int p) { return ProcessGone(p); });
    if (warned_pids_.size() >= kMaxWarnedPids) warned_pids_.clear();
  }
  warned_pids_.insert(pid);
  log_->Warn(
      "connections of process {} ended while it runs on; the chunks "
      "they leased stay with it (said once per process)",
      pid);
}

}  // namespace shmcache
