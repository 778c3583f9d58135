#include "daemon/server.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace shmcache {

namespace asio = boost::asio;
using asio::local::stream_protocol;

Server::Server(asio::io_context& io, Store* store, Logger* log,
               const DaemonOptions& options)
    : io_(io),
      log_(log),
      env_(std::make_shared<ConnectionEnv>(
          store, log, std::chrono::milliseconds(options.stall_timeout_ms),
          options.body_bytes_cap, [this] { RequestStop(); })),
      acceptor_(io),
      accept_timer_(io) {}

Status Server::Listen(const std::string& socket_path) {
  Status fits = CheckSocketPath(socket_path);
  if (!fits.ok()) return fits;
  // The caller holds the instance lock, so an existing socket is stale. A
  // link there is removed, never followed.
  if (unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    struct stat st {};
    const bool socket = lstat(socket_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
    return Status::IOError(fmt::format(
        "cannot remove {} to listen there ({}){}; remove it, or use another port",
        socket_path, std::strerror(err),
        socket ? "" : fmt::format(": {} is not a socket", socket_path)));
  }
  boost::system::error_code ec;
  stream_protocol::endpoint ep(socket_path);
  // The socket is made owner-only (0600) as it is bound: no chmod by name
  // afterwards, which would follow a link put there meanwhile.
  mode_t old = umask(0177);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.bind(ep, ec);
  umask(old);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::IOError("cannot listen on " + socket_path + ": " + ec.message());
  }
  Accept();
  return Status::OK();
}

void Server::Accept() {
  acceptor_.async_accept(
      [this](boost::system::error_code ec, stream_protocol::socket socket) {
        if (ec == asio::error::operation_aborted) return;
        // A client that gave up while queued: nothing is wrong here.
        if (ec && ec != asio::error::connection_aborted) return AcceptLater(ec);
        if (accept_failures_ > 0) {
          log_->Info("accepting connections again, after {} failed attempts",
                     accept_failures_);
          accept_failures_ = 0;
        }
        if (!ec) OnAccepted(std::move(socket));
        Accept();
      });
}

void Server::AcceptLater(const boost::system::error_code& ec) {
  if (accept_failures_++ == 0) {
    rlimit fds{};
    getrlimit(RLIMIT_NOFILE, &fds);
    log_->Warn(
        "cannot accept connections: {} (open files limit {}); retrying "
        "every {} ms, new clients wait meanwhile",
        ec.message(), fds.rlim_cur, kAcceptRetry.count());
  }
  accept_timer_.expires_after(kAcceptRetry);
  accept_timer_.async_wait([this](const boost::system::error_code& e) {
    if (!e) Accept();
  });
}

void Server::OnAccepted(stream_protocol::socket socket) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      cred.uid != geteuid()) {
    log_->Warn("refused a connection from uid {} pid {}: not the server's user", cred.uid,
               cred.pid);
    // Answer it, so the other user reads why; it gets nothing else.
    std::make_shared<ServerConnection>(env_, std::move(socket), 0, nullptr, true)
        ->Start();
    return;
  }
  uint64_t id = next_conn_.fetch_add(1);
  log_->Debug("connection {} from pid {}", id, cred.pid);
  // Held by a pidfd from now on: when the connection ends, whether its
  // process is gone is asked of that process, not of whichever later got
  // its pid.
  std::make_shared<ServerConnection>(env_, std::move(socket), id, peers_.Hold(cred.pid),
                                     false)
      ->Start();
}

void Server::RequestStop() {
  stop_requested_.store(true);
  io_.stop();
}

}  // namespace shmcache
