// Stopping shmcached. A server that answers is asked through its socket.
// One that holds its instance lock but does not answer yet (still
// starting: adopting what an earlier server left) is sent SIGTERM, once it
// is known to be this user's shmcached; it stops at its next check and
// keeps the shared memory for the next start.
#pragma once

#include "shmcache/options.h"
#include "shmcache/status.h"

namespace shmcache::admin {

struct StopResult {
  int pid = 0;
  bool was_starting = false;  // stopped by a signal before it answered
};

// Stops the server `co` names (port resolved) and waits, bounded, until
// its process is gone. Unavailable ("not running") when no process holds
// the instance lock.
Status StopServer(const ClientOptions& co, StopResult* out);

}  // namespace shmcache::admin
