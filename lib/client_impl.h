// ClientImpl: the shared state behind Client and every Cache it opened:
// the control connection and the instance's paths.
//
// Thread safety: Call() serialises requests under a mutex (fork-safe: a
// fork waits for a call in flight). A call's request timeout counts from
// when it is made, its wait for other threads' calls included: a daemon that
// stopped answering costs each caller the timeout once, however many
// threads wait on it. paths() and client_id() may be called
// from any thread, also while a call (which may reconnect) is in flight. After fork() the
// child notices on its next Call (the fork generation changed), drops the inherited
// connection without shutting it down and opens its own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "format/instance.h"
#include "format/protocol_messages.h"
#include "lib/connection.h"
#include "lib/fork_safety.h"
#include "shmcache/options.h"
#include "shmcache/status.h"

namespace shmcache {

class ClientImpl {
 public:
  static Status Create(const ClientOptions& options, std::shared_ptr<ClientImpl>* out);

  // One request and its answer. On success *response holds the answer,
  // its views pointing into *body; Corruption when the answer is malformed.
  // Reconnects first when the connection was broken or inherited across
  // fork(), and once more, to send the request again, when the server had
  // closed the connection before the request reached it (a killed daemon,
  // perhaps restarted since).
  template <typename Request>
  Status Call(const Request& request, typename Request::Response* response,
              std::string* body) EXCLUDES(mu_) {
    protocol::WireReader r({});
    Status s = Exchange(Request::kType, protocol::EncodeBody(request), body, &r);
    if (!s.ok()) return s;
    if (!protocol::DecodeMessage(&r, response)) return Malformed(Request::kName);
    return Status::OK();
  }
  template <typename Request>
  Status Call(const Request& request, typename Request::Response* response) {
    std::string body;
    return Call(request, response, &body);
  }
  // For requests answered with their status alone.
  template <typename Request>
  Status Call(const Request& request) {
    protocol::NoPayload none;
    return Call(request, &none);
  }
  // As Call(request), on the connection open now only: Unavailable, without
  // reconnecting, when it is broken or was inherited across fork(). For
  // requests about what the daemon granted to that connection (a chunk
  // returned through another connection is ignored, and a reconnect to a
  // stopped server would wait out the request timeout for nothing).
  template <typename Request>
  Status CallOnCurrentConnection(const Request& request) EXCLUDES(mu_) {
    std::string body;
    protocol::WireReader r({});
    return Exchange(Request::kType, protocol::EncodeBody(request), &body, &r,
                    /*reconnect=*/false);
  }

  // A copy: a reconnect changes the shm prefix to the server's.
  InstancePaths paths() const EXCLUDES(paths_mu_) {
    ForkSafeLock lock(&paths_mu_);
    return paths_;
  }
  uint32_t client_id() const { return client_id_.load(std::memory_order_relaxed); }
  int port() const { return port_; }

 private:
  using Deadline = std::chrono::steady_clock::time_point;
  ClientImpl() = default;
  // Opens the connection and says hello, both by `deadline`. Unavailable
  // names, where the port's host lock tells, a server of this user that
  // runs with another run dir, or this run dir's, stopped
  // (common/server_elsewhere.h): the "start it" of Connection::Open would
  // be refused.
  Status ConnectLocked(Deadline deadline) REQUIRES(mu_);
  // ConnectLocked without that explanation.
  Status OpenAndHello(Deadline deadline) REQUIRES(mu_);
  // Sends `request` as a body of `type`; on success *reader reads the
  // answer's payload (it points into *body). Reconnects first when needed
  // and `reconnect`, else fails with Unavailable.
  Status Exchange(protocol::MsgType type, const std::string& request, std::string* body,
                  protocol::WireReader* reader, bool reconnect = true) EXCLUDES(mu_);
  static Status Malformed(const char* request_name);

  ForkSafeMutex mu_{LockRank::kClient};
  ClientOptions options_;  // set by Create
  int port_ = 0;           // set by Create
  std::unique_ptr<Connection> conn_ GUARDED_BY(mu_);
  uint64_t fork_gen_ GUARDED_BY(mu_) = 0;
  // Set on every (re)connect, with mu_ held, and read without it: mu_ is
  // held through a daemon round trip, which a reader mapping a segment
  // must not wait for.
  mutable ForkSafeMutex paths_mu_{LockRank::kClientPaths};
  InstancePaths paths_ GUARDED_BY(paths_mu_);
  std::atomic<uint32_t> client_id_{0};
};

}  // namespace shmcache
