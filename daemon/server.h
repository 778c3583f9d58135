// Server: the control socket. Boost.Asio, asynchronous: a client that sends
// garbage, half a frame, or nothing at all occupies only its own
// connection, never a worker thread.
//
// Each connection is checked with SO_PEERCRED: only the daemon's own user
// may talk to it. When a connection ends (client closed or died), the
// chunks it leased are taken back.
#pragma once

#include <atomic>
#include <utility>  // before Asio: 1.74 uses std::exchange without it
#include <boost/asio.hpp>
#include <memory>
#include <string>

#include "logger.h"
#include "request_handler.h"
#include "store.h"

namespace shmcache {

class Server {
 public:
  Server(boost::asio::io_context& io, Store* store, Logger* log);
  // Binds the socket (mode 0600) and starts accepting.
  Status Listen(const std::string& socket_path);
  // True once a client asked the server to stop.
  bool stop_requested() const { return stop_requested_.load(); }
  void RequestStop();

 private:
  class Connection;
  void Accept();

  boost::asio::io_context& io_;
  Store* store_;
  Logger* log_;
  RequestHandler handler_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::atomic<uint64_t> next_conn_{1};
  std::atomic<bool> stop_requested_{false};
};

}  // namespace shmcache
