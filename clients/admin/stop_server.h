// Stopping shmcached. A server that answers is asked through its socket.
// One that holds its instance lock but does not answer yet (still
// starting: adopting what an earlier server left) is sent SIGTERM, once it
// is known to be this user's shmcached, and SIGCONT (one stopped by
// SIGSTOP or Ctrl-Z resumes to act on it); it stops at its next check and
// keeps the shared memory for the next start. One whose socket and lock
// file were removed from its run dir while it ran is found by its host
// lock (which names the run dir) and sent SIGTERM too: it stops as asked
// through its socket would, its shared memory removed.
#pragma once

#include <cstdint>
#include <string>

#include "shmcache/options.h"
#include "shmcache/status.h"

namespace shmcache::admin {

struct StopResult {
  int pid = 0;
  bool was_starting = false;   // stopped by a signal before it answered
  bool was_suspended = false;  // it answered nothing as it was stopped (SIGSTOP)
  bool not_running = false;    // no server held the instance: nothing to stop
  // When not_running: the instance's files that a server which ended
  // without --stop (killed, crashed) left for the next start to adopt, in
  // the shm dir ($SHMCACHE_SHM_DIR or /dev/shm) and the instance's
  // huge-page tmpfs; `left_in` names the directories that hold them.
  int left_files = 0;
  uint64_t left_bytes = 0;
  std::string left_in;
  // When not_running: a server of this user on the port that runs under
  // another run dir (it holds the host lock; the shm files it uses carry
  // the names a server of this run dir would leave, so none in its shm dir
  // is counted as left, and none at all before it has written which that
  // is). Its pid is 0 and its run dir "" when they are not readable yet.
  bool runs_elsewhere = false;
  int other_pid = 0;
  std::string other_run_dir;
  // When stopped: the server was found by its host lock alone, its socket
  // and lock file in run_dir removed while it ran.
  bool run_files_gone = false;
  // When stopped: the server listened, and its socket (`socket_path`) was
  // then removed or replaced (LostSocket's words: "removed", "replaced by
  // a regular file", ...); it was not starting.
  std::string socket_lost;
  std::string socket_path;
  // When not_running or run_files_gone: the run dir looked in
  // (ClientOptions::run_dir, or the default MakeInstancePaths gives).
  std::string run_dir;
};

// Stops the server `co` names (port resolved) and waits, bounded, until
// its process is gone: the one that answers on the run dir's socket, else
// the one that holds its instance lock (starting, or serving with its
// socket removed or replaced: socket_lost), else the one whose host
// lock names the run dir (its socket and lock file removed). OK with
// not_running when there is none (the caller says so as it sees fit);
// what a killed server left is then counted in `shm_dir` ("":
// $SHMCACHE_SHM_DIR or /dev/shm, as a server started without --shm_dir
// uses) and the instance's huge-page dir. Errors: a server this user
// cannot stop or reach (another user's, a bad run dir), one that did not
// exit, or (before anything is asked) a $SHMCACHE_SHM_DIR that --start
// would refuse (empty, relative) where `shm_dir` is "".
Status StopServer(const ClientOptions& co, const std::string& shm_dir, StopResult* out);

}  // namespace shmcache::admin
