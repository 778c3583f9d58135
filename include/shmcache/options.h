// Options of the client API. Plain structs with in-class defaults, every
// member's stated ("{}" for an empty string): GCC before 14 warns under
// -Wextra on a designated initializer that leaves out a member without
// one, and `OpenCache({.session_id = s, .name = "train"}, &cache)` is how
// these are meant to be written.
#pragma once

#include <cstdint>
#include <string>

namespace shmcache {

inline constexpr int kDefaultPort = 50052;
inline constexpr int kMinPort = 1025;
inline constexpr int kMaxPort = 65535;

struct ClientOptions {
  // Instance to connect to. Default 0: $SHMCACHE_PORT, else 50052.
  int port = 0;
  // Must name this host (127.0.0.1, localhost, ::1). Default "":
  // $SHMCACHE_HOST, else 127.0.0.1. Anything else is InvalidArgument.
  std::string hostname{};
  // Directory of the control socket. Default "": $SHMCACHE_RUN_DIR, else
  // /tmp/shmcache-<uid>. Must match the daemon's, and be an absolute path
  // (Connect: InvalidArgument otherwise; a relative one would name another
  // socket in every working directory; $SHMCACHE_RUN_DIR set but empty is
  // refused too, as the admin and the daemon refuse it).
  std::string run_dir{};
  // How long one control request may take before the daemon is declared
  // unavailable, counted from the call: a wait for other threads' requests
  // (or puts) of this process to the same daemon is part of it, and so is
  // the connect (a signal that interrupts a wait resumes it for what is
  // left, never fails it nor restarts the timeout). Default
  // 5000 ms. Must be positive (Connect: InvalidArgument otherwise; 0 would
  // wait for a hung daemon forever).
  int request_timeout_ms = 5000;
  // The `shmcache` command (its arguments, without -p) that a failed
  // connect's message suggests running with another run dir, where a server
  // of this user runs on the port with that run dir (the admin CLI sets its
  // own command line). Default "": the message says to run this process
  // with that SHMCACHE_RUN_DIR.
  std::string admin_command{};
};

struct CacheOptions {
  // Session from `shmcache -g`. Must exist.
  uint32_t session_id = 0;
  // Cache name inside the session. Default "": the fingerprint.
  std::string name{};
  // What produced the rows (e.g. a hash of the pipeline). Re-opening a name
  // with another fingerprint fails with FingerprintMismatch. At most 255
  // bytes; name likewise.
  std::string fingerprint{};
  // Memory budget in MB. 0 = as much as the server's cap allows; more than
  // the cap gets the cap; more than 2^43 - 1 MB (bytes past an int64) is
  // InvalidArgument. Opening a cache that exists with a larger size raises
  // its budget (a full cache's fix: a larger size_mb), and it takes rows
  // again unless the cap made it full; a smaller size, or 0, keeps the
  // budget it has: nothing is evicted.
  uint64_t size_mb = 0;
  // Rows beyond the budget go to disk (needs a server started with -s).
  // MindSpore's and DatasetCache's `spilling` argument. Asked of a cache
  // that exists without it, it turns spilling on (a full cache then takes
  // rows again, on disk); false leaves a cache's spilling as it is.
  bool spill_requested = false;
};

}  // namespace shmcache
