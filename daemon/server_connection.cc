#include "daemon/server_connection.h"

#include <algorithm>
#include <cstring>

namespace shmcache {

namespace asio = boost::asio;
using boost::system::error_code;

bool BodyBudget::TryTake(uint64_t n) {
  uint64_t cur = used_.load(std::memory_order_relaxed);
  do {
    if (n > cap_ || cur > cap_ - n) return false;
  } while (!used_.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
  return true;
}

ServerConnection::ServerConnection(std::shared_ptr<ConnectionEnv> env, Socket socket,
                                   uint64_t id, std::shared_ptr<const ProcessHandle> peer,
                                   bool refused)
    : env_(std::move(env)),
      socket_(std::move(socket)),
      strand_(asio::make_strand(socket_.get_executor())),
      stall_timer_(strand_),
      id_(id),
      peer_(std::move(peer)),
      refused_(refused) {
  env_->store->CountConnection(+1);
}

// Runs also while the io_context is destroyed after the Server: touches
// only what env_ keeps alive.
ServerConnection::~ServerConnection() {
  env_->budget.Give(charged_);
  env_->store->CountConnection(-1);
  if (peer_) env_->store->ReleaseConnection(id_, std::move(peer_));
}

void ServerConnection::Start() {
  // Sends are tried at once, before any wait (Write): a send the socket
  // cannot take whole returns what it took instead of blocking.
  error_code ignored;
  socket_.non_blocking(true, ignored);
  asio::post(strand_, [self = shared_from_this()] { self->ReadHeader(); });
}

void ServerConnection::ReadHeader() {
  in_frame_ = false;
  if (in_len_ > 0) {
    // What a client sent beyond its last frame (none of this library's
    // clients does: one request at a time) starts the next one. Posted, not
    // run here: frames sent back to back are answered one per handler.
    NoteProgress();
    asio::post(strand_, [this, self = shared_from_this()] { OnBytes(); });
    return;
  }
  ReadMore();
}

void ServerConnection::ReadMore() {
  socket_.async_read_some(
      asio::buffer(in_.data() + in_len_, in_.size() - in_len_),
      asio::bind_executor(
          strand_, [this, self = shared_from_this()](const error_code& ec, size_t n) {
            if (ec) return Close();  // the peer closed: the destructor cleans up
            if (n > 0) NoteProgress();
            in_len_ += n;
            OnBytes();
          }));
}

void ServerConnection::OnBytes() {
  if (closed_) return;
  if (in_len_ < header_.size()) return ReadMore();
  std::memcpy(header_.data(), in_.data(), header_.size());
  OnHeader();
}

void ServerConnection::OnHeader() {
  protocol::FrameHeader h;
  Status s = protocol::DecodeFrameHeader(header_, &h);
  if (!s.ok() || (h.type & protocol::kResponseBit)) {
    env_->log->Warn("connection {}: {}; closing it", id_,
                    s.ok() ? "a response frame sent as request" : s.message());
    in_len_ = 0;  // nothing more is read from it
    if (s.IsNotSupported()) {
      // A client of another protocol version (another build): told so in a
      // frame of this one, whose version its header check reads first,
      // then closed. Closed alone, it saw only "connection closed".
      type_ = static_cast<protocol::MsgType>(h.type);
      last_answer_ = true;
      return Write(protocol::EncodeStatus(s), false);
    }
    return Close();
  }
  type_ = static_cast<protocol::MsgType>(h.type);
  body_len_ = h.body_len;
  body_got_ = 0;
  body_.clear();
  // The body's bytes that came with the header (all of a small request's:
  // the client sends both with one write, and one receive took them).
  const size_t came = std::min<size_t>(in_len_ - header_.size(), body_len_);
  if (came > 0) {
    if (!GrowBody(came)) return;
    std::memcpy(body_.data(), in_.data() + header_.size(), came);
    body_got_ = came;
  }
  const size_t used = header_.size() + came;
  std::memmove(in_.data(), in_.data() + used, in_len_ - used);
  in_len_ -= used;
  if (body_got_ == body_len_) return Answer();
  ReadBodyPiece();
}

void ServerConnection::ReadBodyPiece() {
  // Pieces grow with what arrived, so that a body that stops early holds
  // little more than what was sent.
  size_t piece = std::clamp<size_t>(body_got_, kMinPieceBytes, kPieceBytes);
  size_t want = std::min<size_t>(body_len_ - body_got_, piece);
  if (!GrowBody(body_got_ + want)) return;
  asio::async_read(
      socket_, asio::buffer(body_.data() + body_got_, want),
      [this, want](const error_code& ec, size_t done) {
        return Transfer(ec, done, want);
      },
      asio::bind_executor(
          strand_, [this, self = shared_from_this()](const error_code& ec, size_t n) {
            if (ec) return Close();
            body_got_ += n;
            if (body_got_ < body_len_) return ReadBodyPiece();
            Answer();
          }));
}

void ServerConnection::Answer() {
  bool stop = false;
  std::string resp;
  if (refused_) {
    resp = protocol::EncodeStatus(Status::PermissionDenied(
        "permission denied: the cache server belongs to another user"));
  } else {
    resp = env_->handler.Handle(id_, type_, body_, &stop);
  }
  DropBuffers();
  Write(std::move(resp), stop);
}

void ServerConnection::Write(std::string body, bool stop) {
  protocol::FrameHeader h;
  h.type = static_cast<uint16_t>(type_) | protocol::kResponseBit;
  h.body_len = static_cast<uint32_t>(body.size());
  protocol::EncodeFrameHeader(h, out_header_.data());
  out_body_ = std::move(body);  // sent as it is, behind the header
  std::array<asio::const_buffer, 2> buffers = {asio::buffer(out_header_),
                                               asio::buffer(out_body_)};
  const size_t total = out_header_.size() + out_body_.size();
  NoteProgress();  // the handler may have taken long: the answer starts now
  // Sent here first: an answer the socket takes whole (any small one) then
  // costs no wait for writability and no handler of its own, and the next
  // request's read starts at once. Only what it did not take is left to an
  // asynchronous write.
  error_code ec;
  const size_t sent = socket_.send(buffers, 0, ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) ec = {};
  if (ec || sent == total) return Written(ec, stop);
  if (sent < buffers[0].size()) {
    buffers[0] += sent;
  } else {
    buffers[1] += sent - buffers[0].size();
    buffers[0] = asio::const_buffer();
  }
  const size_t left = total - sent;
  asio::async_write(
      socket_, buffers,
      [this, left](const error_code& e, size_t done) { return Transfer(e, done, left); },
      asio::bind_executor(
          strand_, [this, stop, self = shared_from_this()](const error_code& e, size_t) {
            Written(e, stop);
          }));
}

void ServerConnection::Written(const error_code& ec, bool stop) {
  if (stop) {
    env_->request_stop();
    return;
  }
  DropBuffers();
  if (ec || refused_ || last_answer_) return Close();
  ReadHeader();
}

size_t ServerConnection::Transfer(const error_code& ec, size_t done, size_t want) {
  if (ec) return 0;
  if (done > 0) NoteProgress();
  return want - done;
}

void ServerConnection::NoteProgress() {
  last_progress_ = Clock::now();
  in_frame_ = true;
  if (!timer_armed_) ArmStallTimer(last_progress_ + env_->stall_timeout);
}

void ServerConnection::ArmStallTimer(Clock::time_point at) {
  timer_armed_ = true;
  stall_timer_.expires_at(at);
  stall_timer_.async_wait(asio::bind_executor(
      strand_, [this, self = shared_from_this()](const error_code& ec) {
        timer_armed_ = false;
        if (!ec) OnStallTimer();
      }));
}

void ServerConnection::OnStallTimer() {
  if (closed_ || !in_frame_) return;  // idle between frames: no deadline
  Clock::time_point deadline = last_progress_ + env_->stall_timeout;
  if (Clock::now() < deadline) return ArmStallTimer(deadline);
  env_->log->Warn(
      "connection {} of process {}: stalled in the middle of a frame for {} ms; "
      "closing it",
      id_, PeerPid(), env_->stall_timeout.count());
  Close();
}

bool ServerConnection::GrowBody(size_t size) {
  size_t have = body_.capacity();
  if (size > have) {
    size_t grown = std::min<size_t>(body_len_, std::max(size, 2 * have));
    if (!env_->budget.TryTake(grown - have)) {
      env_->log->Warn(
          "connection {} of process {}: request bodies being read would pass "
          "{} MB, the cap of all connections together; closing it",
          id_, PeerPid(), env_->budget.cap() >> 20);
      Close();
      return false;
    }
    charged_ += grown - have;
    body_.reserve(grown);
  }
  body_.resize(size);
  return true;
}

void ServerConnection::DropBuffers() {
  if (body_.capacity() > kKeepBytes) std::vector<std::byte>().swap(body_);
  if (out_body_.capacity() > kKeepBytes) std::string().swap(out_body_);
  // What is kept (a few KB at most) is no longer charged: idle connections
  // must not use up the budget.
  env_->budget.Give(charged_);
  charged_ = 0;
}

void ServerConnection::Close() {
  closed_ = true;
  error_code ignored;
  stall_timer_.cancel();
  socket_.close(ignored);
  // The peer sees the close at once, and may connect again: the budget
  // this connection's body held goes back now, not when its last handler
  // lets go of it (a reconnecting client was refused for the bytes of the
  // connection the cap had just closed). The buffer itself stays until
  // then: a cancelled read may still refer to it.
  env_->budget.Give(charged_);
  charged_ = 0;
}

}  // namespace shmcache
