// Client: a connection to one shmcached instance, and the door to its
// sessions and caches.
//
//   std::unique_ptr<shmcache::Client> client;
//   Status s = shmcache::Client::Connect({}, &client);
//   std::unique_ptr<shmcache::Cache> cache;
//   s = client->OpenCache({.session_id = id, .fingerprint = "resnet-train"},
//                         &cache);
//
// Thread safety: all methods may be called concurrently. Fork: a child may
// keep using a Client (and its Caches) created before the fork; it opens its
// own connection on first need.
// Errors: Unavailable when the daemon cannot be reached (its message says
// why, and what to do: no server on the port; one of this user's running
// with another run dir, named with its run dir and pid; this run dir's
// server stopped by SIGSTOP, or its socket removed; a server that did not
// accept the connection within the request timeout); InvalidArgument for
// a non-local host, a bad port or run dir, or a request timeout that is not
// positive (options.h); PermissionDenied when the process
// listening at the instance's socket runs as another uid (it is told
// nothing); otherwise what the daemon answered. After an error every
// out-parameter is unchanged (status.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "shmcache/cache.h"
#include "shmcache/export.h"
#include "shmcache/options.h"
#include "shmcache/stats.h"
#include "shmcache/status.h"

namespace shmcache {

class ClientImpl;

class SHMCACHE_EXPORT Client {
 public:
  static Status Connect(const ClientOptions& options, std::unique_ptr<Client>* out);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // A new session with a random, unique, non-zero 32-bit id. IOError, and
  // no session, when the server cannot record it in its sessions list (it
  // would not survive a restart).
  Status CreateSession(uint32_t* session_id);
  // Drops the session, its caches and their memory. NotFound if absent;
  // IOError when it was dropped but the sessions list could not be
  // rewritten (a restarted server would list it again, empty).
  Status DestroySession(uint32_t session_id);
  // NotFound if absent.
  Status CheckSession(uint32_t session_id);
  // Opens (creating if needed) a cache. The Cache keeps the connection's
  // state alive: it may outlive this Client object.
  // A size_mb above the server's memory cap is not an error: the cache gets
  // the cap (options.h).
  // Errors: NotFound when the session does not exist. InvalidArgument when
  // the options are wrong: no name and no fingerprint, either longer than
  // 255 bytes or not UTF-8, a size_mb whose bytes do not fit an int64 (over
  // 2^43 - 1 MB), or spilling asked of a server started without a spill
  // directory.
  // FingerprintMismatch when the session has a cache of this name with
  // another fingerprint. Full when the server's memory cap (or its shm
  // filesystem) has no room for a new cache. Unavailable when the daemon
  // cannot be reached. Corruption, PermissionDenied or IOError when the
  // cache's shared-memory files cannot be mapped or fail validation.
  Status OpenCache(const CacheOptions& options, std::unique_ptr<Cache>* out);

  Status ListSessions(std::vector<SessionInfo>* out);
  Status GetServerInfo(ServerInfo* out);
  // Asks the daemon to exit, removing its socket and shared memory.
  Status StopServer();

 private:
  SHMCACHE_LOCAL explicit Client(std::shared_ptr<ClientImpl> impl);
  std::shared_ptr<ClientImpl> impl_;
};

}  // namespace shmcache
