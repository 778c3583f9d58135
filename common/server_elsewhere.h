// What a client says when no server answers where it looks (the socket of
// its run dir, $SHMCACHE_RUN_DIR) but the port's host lock names a server
// of this user (instance_lock.h): one that runs with another run dir, or
// this run dir's own, stopped (SIGSTOP) or its socket removed while it
// ran. "Not running; start it" would be wrong there, and the start it
// suggests is refused (one server per user and port, whatever its run
// dir). The one place that says it: libshmcache's connect
// (ClientImpl::ConnectLocked), so C++ trainers, the Python package (its
// errors and DatasetCache's warning) and the admin (its command line in
// ClientOptions::admin_command) all say the same, from one read of the lock.
#pragma once

#include <string>

#include "shmcache/status.h"

namespace shmcache {

// Whether two paths name one directory (the same text where either is
// gone).
bool SameDir(const std::string& a, const std::string& b);

// What became of the socket at `socket_path` of a server that listens
// there (its host lock says it serves) but that no connect reaches: ""
// when a socket is there (the server may just be slow to answer),
// "removed" when nothing is, else "replaced by a regular file" (a FIFO, a
// directory, a symbolic link, something else): put there while it ran.
// Never follows a link.
std::string LostSocket(const std::string& socket_path);

// `connect_error`: what connecting to the server of `port` (resolved) in
// `run_dir` ("": the default, format/instance.h DefaultRunDir) gave.
// Returns it unchanged unless it is Unavailable and either the run dir is
// one a start would refuse (then Unavailable with CheckOwnRunDir's words:
// a link, another user's directory), or a server of this user holds the
// port's host lock (ProbeHostLock: read only, never through a link, only
// this user's regular file; anything else is no server). Then Unavailable
// saying which server that is, its run dir and process id, and how to
// reach it or stop it; for this run dir's own server, that it is stopped
// (SIGSTOP: 'kill -CONT'), still starting (not listening yet:
// HostLockHolder::serving) or that its socket is gone (else the connect's
// error, a timeout, stands). Always Unavailable where `connect_error` was. `command`: the
// shmcache command line (without -p) to suggest running with that run dir
// (ClientOptions::admin_command, the admin's); "" for a program of the
// library's, which is told to run with that SHMCACHE_RUN_DIR.
// Never blocks on the server; signals nothing; thread-safe.
Status ExplainNoServerHere(int port, const std::string& run_dir,
                           const std::string& command, const Status& connect_error);

}  // namespace shmcache
