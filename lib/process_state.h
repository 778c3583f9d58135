// Whether a process is gone, for code that must not act while it can still
// run: recycling a client's memory, reusing an instance after its daemon.
#pragma once

namespace shmcache {

// True when no thread of `pid` can run any more: the process does not
// exist, or it is a zombie whose last thread has exited. (A killed
// process's leader turns zombie before its other threads are gone, and
// with them its open files and locks.) A pid of 0 or less counts as gone.
bool ProcessGone(int pid);

}  // namespace shmcache
