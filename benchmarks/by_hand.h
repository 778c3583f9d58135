// Helpers of the small drivers run by hand (put_fill_cpu, grow_stall),
// which link the library alone, not the harness's bench_util.
#pragma once

#include <time.h>

#include <cstdint>
#include <cstdio>
#include <memory>

#include "shmcache/client.h"
#include "shmcache/status.h"

namespace shmcache::by_hand {

// Seconds of CLOCK_MONOTONIC.
inline double Now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

// Prints "what: status" to stderr; returns the exit code 1.
inline int Fail(const char* what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return 1;
}

// Connects to the server on `port`, creates a session there and opens a
// cache of `options` in it (their session_id set here). nullptr, or on a
// failure the step's name with *status set.
inline const char* OpenInNewSession(int port, CacheOptions options,
                                    std::unique_ptr<Client>* client, uint32_t* session,
                                    std::unique_ptr<Cache>* cache, Status* status) {
  *status = Client::Connect({.port = port}, client);
  if (!status->ok()) return "connect";
  *status = (*client)->CreateSession(session);
  if (!status->ok()) return "session";
  options.session_id = *session;
  *status = (*client)->OpenCache(options, cache);
  return status->ok() ? nullptr : "open";
}

}  // namespace shmcache::by_hand
