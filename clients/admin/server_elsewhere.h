// What a command of this run dir says when no server answers on its
// socket, but a server of this user holds the port's host lock: one that
// runs with another run dir ($SHMCACHE_RUN_DIR), or this run dir's own
// whose socket was removed while it ran. "Not running; start it" would be
// wrong there, and the start it suggests is refused (one server per user
// and port, whatever its run dir: instance_lock.h).
#pragma once

#include <string>

#include "shmcache/options.h"
#include "shmcache/status.h"

namespace shmcache::admin {

// Whether two paths name one directory (the same text where either is
// gone).
bool SameDir(const std::string& a, const std::string& b);

// `connect_error`: what connecting to the server `co` names (port
// resolved) gave. Returns it unchanged unless it is Unavailable and the
// run dir is one a start would refuse (CheckOwnRunDir's PermissionDenied:
// a link, another user's directory), or a server of this user holds the
// port's host lock; then Unavailable saying
// which server that is and the commands that reach it (`command`, as a
// shmcache command line without -p, run with its run dir) or stop it; for
// this run dir's own server, that it is stopped (SIGSTOP) or that its
// socket is gone (else the connect's error, a timeout, stands). Never
// blocks; signals nothing.
Status ExplainNoServerHere(const ClientOptions& co, const std::string& command,
                           const Status& connect_error);

}  // namespace shmcache::admin
