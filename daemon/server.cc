#include "server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <vector>

namespace shmcache {

namespace asio = boost::asio;
using asio::local::stream_protocol;

class Server::Connection : public std::enable_shared_from_this<Connection> {
 public:
  // refused: the peer is another user; its first request is answered with
  // PermissionDenied and the connection closed.
  Connection(Server* server, stream_protocol::socket socket, uint64_t id, int pid,
             bool refused)
      : server_(server),
        store_(server->store_),
        socket_(std::move(socket)),
        id_(id),
        pid_(pid),
        refused_(refused) {
    store_->CountConnection(+1);
  }
  // Runs also while the io_context is destroyed after the Server: touch
  // only the Store, which outlives both.
  ~Connection() {
    store_->CountConnection(-1);
    store_->ReleaseConnection(id_, pid_);
  }

  void Start() { ReadHeader(); }

 private:
  void ReadHeader() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(header_),
                     [this, self](boost::system::error_code ec, size_t) {
                       if (ec) return;  // closed: the destructor cleans up
                       protocol::FrameHeader h;
                       Status s = protocol::DecodeFrameHeader(header_, &h);
                       if (!s.ok() || (h.type & protocol::kResponseBit)) {
                         server_->log_->Warn(
                             "connection {}: {}; closing it", id_,
                             s.ok() ? "a response frame sent as request" : s.message());
                         return;
                       }
                       type_ = static_cast<protocol::MsgType>(h.type);
                       body_.resize(h.body_len);
                       ReadBody();
                     });
  }

  void ReadBody() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(body_),
                     [this, self](boost::system::error_code ec, size_t) {
                       if (ec) return;
                       bool stop = false;
                       std::string resp;
                       if (refused_) {
                         protocol::WireWriter w;
                         protocol::WriteStatus(
                             w, Status::PermissionDenied(
                                    "permission denied: the cache server belongs to "
                                    "another user"));
                         resp = std::move(w.body());
                       } else {
                         resp = server_->handler_.Handle(id_, type_, body_, &stop);
                       }
                       Write(std::move(resp), stop);
                     });
  }

  void Write(std::string body, bool stop) {
    protocol::FrameHeader h;
    h.type = static_cast<uint16_t>(type_) | protocol::kResponseBit;
    h.body_len = static_cast<uint32_t>(body.size());
    protocol::EncodeFrameHeader(h, out_header_.data());
    out_body_ = std::move(body);  // sent as it is, behind the header
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(out_header_),
                                                 asio::buffer(out_body_)};
    auto self = shared_from_this();
    asio::async_write(socket_, buffers,
                      [this, self, stop](boost::system::error_code ec, size_t) {
                        if (stop) {
                          server_->RequestStop();
                          return;
                        }
                        if (!ec && !refused_) ReadHeader();
                      });
  }

  Server* server_;
  Store* store_;
  stream_protocol::socket socket_;
  uint64_t id_;
  int pid_;  // of the peer, from SO_PEERCRED
  bool refused_;
  std::array<std::byte, protocol::kFrameHeaderBytes> header_{};
  protocol::MsgType type_{};
  std::vector<std::byte> body_;
  std::array<std::byte, protocol::kFrameHeaderBytes> out_header_{};
  std::string out_body_;
};

Server::Server(asio::io_context& io, Store* store, Logger* log)
    : io_(io), store_(store), log_(log), handler_(store), acceptor_(io) {}

Status Server::Listen(const std::string& socket_path) {
  // The caller holds the instance lock, so an existing socket is stale.
  unlink(socket_path.c_str());
  boost::system::error_code ec;
  stream_protocol::endpoint ep(socket_path);
  mode_t old = umask(0077);  // the socket is created owner-only
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.bind(ep, ec);
  umask(old);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::IOError("cannot listen on " + socket_path + ": " + ec.message());
  }
  chmod(socket_path.c_str(), 0600);
  Accept();
  return Status::OK();
}

void Server::Accept() {
  acceptor_.async_accept([this](boost::system::error_code ec,
                                stream_protocol::socket socket) {
    if (ec) {
      if (ec != asio::error::operation_aborted) Accept();
      return;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred,
                   &len) != 0 ||
        cred.uid != geteuid()) {
      log_->Warn("refused a connection from uid {} pid {}: not the server's user",
                 cred.uid, cred.pid);
      // Answer it, so the other user reads why; it gets nothing else.
      std::make_shared<Connection>(this, std::move(socket), 0, 0, true)->Start();
    } else {
      uint64_t id = next_conn_.fetch_add(1);
      log_->Debug("connection {} from pid {}", id, cred.pid);
      std::make_shared<Connection>(this, std::move(socket), id, cred.pid, false)
          ->Start();
    }
    Accept();
  });
}

void Server::RequestStop() {
  stop_requested_.store(true);
  io_.stop();
}

}  // namespace shmcache
