// ServerConnection: one client's control connection inside the daemon. It
// reads request frames, has the RequestHandler answer them and writes the
// responses back; all of its handlers run on its own strand.
//
// Memory: a request body is read in pieces into a buffer that grows as the
// bytes arrive, so a frame that announces a large body and then stops costs
// only what was sent. The body buffers of all connections together stay
// under a BodyBudget; a connection that would pass it is closed with a log
// line (its client sees the connection break and treats the request as a
// miss). Between frames a connection keeps no large buffer.
//
// Stalls: a connection that makes no progress for `stall_timeout` in the
// middle of a frame (part of a header or body received, or a response not
// taken) is closed. A connection idle between frames is never timed out:
// clients keep theirs open for the whole training run.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>  // before Asio: 1.74 uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>

#include "common/process_state.h"
#include "daemon/logger.h"
#include "daemon/request_handler.h"
#include "daemon/store.h"
#include "format/protocol.h"

namespace shmcache {

// Bytes of request bodies being read, all connections together.
// Thread safety: all methods may be called from any thread.
class BodyBudget {
 public:
  explicit BodyBudget(uint64_t cap) : cap_(cap) {}
  // Takes n bytes; false (taking nothing) when that would pass the cap.
  bool TryTake(uint64_t n);
  void Give(uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }
  uint64_t cap() const { return cap_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  const uint64_t cap_;
  std::atomic<uint64_t> used_{0};
};

// What every connection of one Server shares. Connections hold it by
// shared_ptr: the io_context, which destroys the last connections, may
// outlive the Server.
struct ConnectionEnv {
  ConnectionEnv(Store* s, Logger* l, std::chrono::milliseconds stall, uint64_t body_cap,
                std::function<void()> stop)
      : store(s),
        log(l),
        handler(s),
        stall_timeout(stall),
        budget(body_cap),
        request_stop(std::move(stop)) {}
  Store* store;  // outlives every connection
  Logger* log;   // outlives every connection
  RequestHandler handler;
  std::chrono::milliseconds stall_timeout;
  BodyBudget budget;
  // Called from a handler, never from a destructor (the Server may be gone).
  std::function<void()> request_stop;
};

class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;
  // peer: the process at the other end, held from the accept on (see
  // Store::ReleaseConnection); null when refused: the peer is another user,
  // its first request is answered with PermissionDenied and the connection
  // closed.
  ServerConnection(std::shared_ptr<ConnectionEnv> env, Socket socket, uint64_t id,
                   std::shared_ptr<const ProcessHandle> peer, bool refused);
  // Gives the connection's chunks back to the Store (see
  // Store::ReleaseConnection).
  ~ServerConnection();

  void Start();

  // Request bodies are read in pieces of kMinPieceBytes up to kPieceBytes.
  static constexpr size_t kMinPieceBytes = 64u << 10;
  static constexpr size_t kPieceBytes = 1u << 20;
  // Buffers up to this size are kept from one frame to the next.
  static constexpr size_t kKeepBytes = 64u << 10;
  // A frame's header and the first bytes of its body are read together,
  // up to this many.
  static constexpr size_t kReadAheadBytes = 4096;

 private:
  using Clock = std::chrono::steady_clock;
  // Starts the next frame: from bytes read already, or from the socket.
  void ReadHeader();
  // Reads what the socket has into in_ (a frame's header, and with it all
  // of a small body or the start of a larger one).
  void ReadMore();
  // A header whole in in_: OnHeader; otherwise more is read.
  void OnBytes();
  void OnHeader();
  void ReadBodyPiece();
  void Answer();
  void Write(std::string body, bool stop);
  // The answer went out (or failed: ec): the next request, or the close.
  void Written(const boost::system::error_code& ec, bool stop);
  // Completion condition of every transfer: bytes moving are progress.
  size_t Transfer(const boost::system::error_code& ec, size_t done, size_t want);
  // The frame moved (or started): restarts the stall clock.
  void NoteProgress();
  void ArmStallTimer(Clock::time_point at);
  void OnStallTimer();
  // Makes body_ `size` bytes, growing its buffer geometrically up to the
  // announced length. False (and the connection closed) when the budget
  // does not allow it.
  bool GrowBody(size_t size);
  // Ends the frame's claim on memory: large buffers are freed.
  void DropBuffers();
  void Close();
  // The peer's pid, for log lines (0 for a refused connection).
  int PeerPid() const { return peer_ ? peer_->pid() : 0; }

  std::shared_ptr<ConnectionEnv> env_;
  Socket socket_;
  boost::asio::strand<Socket::executor_type> strand_;
  boost::asio::steady_timer stall_timer_;
  uint64_t id_;
  std::shared_ptr<const ProcessHandle> peer_;  // its pid from SO_PEERCRED
  bool refused_;
  // State below is touched only on strand_.
  bool closed_ = false;
  bool last_answer_ = false;  // closed once the answer is written
  bool in_frame_ = false;     // between a frame's first byte and its answer
  bool timer_armed_ = false;
  Clock::time_point last_progress_;
  std::array<std::byte, protocol::kFrameHeaderBytes> header_{};
  // Bytes received and not yet part of a frame's header or body: one
  // receive takes a request's header with its body when the body is small
  // (a spilled Put's ids and sizes: 2 receives per request were 1 wasted
  // system call and one more handler; docs/spill-reads.md).
  std::array<std::byte, kReadAheadBytes> in_{};
  size_t in_len_ = 0;
  protocol::MsgType type_{};
  uint32_t body_len_ = 0;
  size_t body_got_ = 0;
  std::vector<std::byte> body_;
  uint64_t charged_ = 0;  // bytes of body_'s buffer taken from the budget
  std::array<std::byte, protocol::kFrameHeaderBytes> out_header_{};
  std::string out_body_;
};

}  // namespace shmcache
