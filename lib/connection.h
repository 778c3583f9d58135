// Connection: the client's end of the control socket. Blocking calls with a
// timeout; one request in flight at a time.
//
// Thread safety: none; ClientImpl serialises calls.
#pragma once

#include <memory>
#include <string>

#include "format/protocol.h"
#include "shmcache/status.h"

namespace shmcache {

class Connection {
 public:
  ~Connection();
  // Unavailable when nobody listens on socket_path (the message says the
  // server is not running and how to start it), or when the listener did
  // not accept within timeout_ms (its backlog full; signals resume the
  // wait for what is left of it). PermissionDenied, before a
  // byte is sent, when the process listening there runs as another uid
  // (SO_PEERCRED): the message names its user and the fix.
  static Status Open(const std::string& socket_path, int port, int timeout_ms,
                     std::unique_ptr<Connection>* out);

  // Sends a request, waits for the response and returns its payload reader
  // over *body. Each send and receive waits at most timeout_ms, however
  // often signals interrupt it (EINTR resumes what is left of the wait).
  // The returned status is the daemon's answer, or Unavailable when the
  // transport failed (the connection is then broken()).
  Status Call(protocol::MsgType type, const std::string& request, std::string* body,
              size_t* payload_offset, int timeout_ms);

  bool broken() const { return fd_ < 0; }
  // After a Call that failed: whether the server had closed the connection
  // before the request reached it (its send failed with EPIPE or
  // ECONNRESET), so that nothing of the request was done.
  bool closed_before_request() const { return closed_before_request_; }
  // Closes the descriptor without a shutdown, so a parent process that
  // shares it after fork() keeps its connection.
  void Abandon();

 private:
  Connection(int fd, int port, int timeout_ms)
      : fd_(fd), port_(port), timeout_ms_(timeout_ms) {}
  // The most bytes of an answer's body read with its header.
  static constexpr size_t kFirstBodyBytes = 4096;
  Status Broken(const std::string& what);
  Status Exchange(protocol::MsgType type, const std::string& request, std::string* body,
                  size_t* payload_offset);
  int fd_;
  int port_;
  int timeout_ms_;  // the socket's send and receive timeouts now
  bool closed_before_request_ = false;
};

}  // namespace shmcache
