// Server: the control socket. Boost.Asio, asynchronous: a client that sends
// garbage, half a frame, or nothing at all occupies only its own
// connection, never a worker thread (see ServerConnection for the memory
// and time a connection may hold).
//
// Each connection is checked with SO_PEERCRED: only the daemon's own user
// may talk to it. When a connection ends (client closed or died), the
// chunks it leased are taken back.
//
// When accept fails for want of resources (descriptors, memory), the
// server says so once and retries every kAcceptRetry instead of spinning;
// it says so again once it accepts connections anew.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>

#include "daemon/daemon_options.h"
#include "daemon/logger.h"
#include "daemon/peer_processes.h"
#include "daemon/server_connection.h"
#include "daemon/store.h"

namespace shmcache {

class Server {
 public:
  // Uses options.stall_timeout_ms and options.body_bytes_cap.
  Server(boost::asio::io_context& io, Store* store, Logger* log,
         const DaemonOptions& options);
  // Binds the socket (mode 0600) and starts accepting.
  Status Listen(const std::string& socket_path);
  // True once a client asked the server to stop.
  bool stop_requested() const { return stop_requested_.load(); }
  void RequestStop();

  static constexpr std::chrono::milliseconds kAcceptRetry{100};

 private:
  void Accept();
  void OnAccepted(ServerConnection::Socket socket);
  void AcceptLater(const boost::system::error_code& ec);

  boost::asio::io_context& io_;
  Logger* log_;
  std::shared_ptr<ConnectionEnv> env_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer accept_timer_;
  uint64_t accept_failures_ = 0;  // in a row; touched by the accept chain only
  PeerProcesses peers_;           // touched by the accept chain only
  std::atomic<uint64_t> next_conn_{1};
  std::atomic<bool> stop_requested_{false};
};

}  // namespace shmcache
