#include "lib/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <span>

#include <fmt/format.h>

#include "format/instance.h"
#include "format/owned_dir.h"

namespace shmcache {

static void SetTimeouts(int fd, int timeout_ms) {
  timeval tv{timeout_ms / 1000, static_cast<suseconds_t>(timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// The point a wait of timeout_ms from now ends at.
static std::chrono::steady_clock::time_point DeadlineIn(int timeout_ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
}

// Milliseconds left until `deadline`, 0 once it passed.
static int MsLeft(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

// After a call a signal interrupted (EINTR): whether to try it again, which
// is while `deadline` has not passed; else errno is set to EAGAIN, as the
// socket's timeout sets it, and the caller reports the failure.
static bool RetryAfterSignal(std::chrono::steady_clock::time_point deadline) {
  if (MsLeft(deadline) > 0) return true;
  errno = EAGAIN;
  return false;
}

Connection::~Connection() {
  if (fd_ >= 0) close(fd_);
}

void Connection::Abandon() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

Status Connection::Open(const std::string& socket_path, int port, int timeout_ms,
                        std::unique_ptr<Connection>* out) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  Status fits = CheckSocketPath(socket_path);
  if (!fits.ok()) return fits;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno("socket", errno);
  // A connect waits (the socket's send timeout) while the server's backlog
  // is full. A signal interrupts that wait (EINTR, whatever SA_RESTART
  // says, since the socket has a timeout): the connect is made again for
  // what is left of the timeout, not failed as "not running", nor given
  // the whole timeout again (a process signalled more often than its
  // timeout would wait for as long as the signals came).
  const auto deadline = DeadlineIn(timeout_ms);
  int wait_ms = timeout_ms;
  SetTimeouts(fd, wait_ms);
  int rc;
  while ((rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr)) != 0 &&
         errno == EINTR && RetryAfterSignal(deadline)) {
    wait_ms = std::max(MsLeft(deadline), 1);
    SetTimeouts(fd, wait_ms);
  }
  if (rc != 0) {
    int e = errno;
    close(fd);
    if (e == EAGAIN) {
      // The backlog stayed full: a server listens there, so "not running;
      // start it" would be wrong (the start is refused).
      return Status::Unavailable(fmt::format(
          "cache server on port {} did not accept the connection within {} ms ({}: "
          "the connections waiting for it fill its queue: it is hung or overloaded); "
          "try again, or restart it ('shmcache --stop -p {}', then '--start')",
          port, timeout_ms, socket_path, port));
    }
    if (e == EACCES || e == EPERM) {
      return Status::PermissionDenied(
          fmt::format("permission denied connecting to the cache server on port {} ({}): "
                      "it belongs to another user, and a server serves only its own; "
                      "start one of yours with 'shmcache --start', with SHMCACHE_RUN_DIR "
                      "unset or a directory of your own",
                      port, socket_path));
    }
    return Status::Unavailable(
        fmt::format("cache server on port {} is not running ({}: {}); start it with "
                    "'shmcache --start -p {}'",
                    port, socket_path, std::strerror(e), port));
  }
  // The socket's place is only as safe as the run dir: whoever listens there
  // must be a server of this user before it is told anything (the first
  // request names sessions and caches; every answer is trusted). A server
  // answers only its own uid, so a listener of another uid, root included,
  // is never one this process could use.
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      cred.uid != geteuid()) {
    close(fd);
    const std::string dir = socket_path.substr(0, socket_path.rfind('/'));
    return Status::PermissionDenied(fmt::format(
        "the process listening at {} runs as {}, not as this user ({}): refusing to talk "
        "to it as the cache server of port {}; a server serves only its own user, so "
        "someone else's process took the socket's place: check that {} is a directory "
        "of yours, mode 0700, or set SHMCACHE_RUN_DIR to one",
        socket_path, OwnerName(cred.uid), OwnerName(geteuid()), port, dir));
  }
  out->reset(new Connection(fd, port, wait_ms));
  return Status::OK();
}

Status Connection::Broken(const std::string& what) {
  Abandon();
  return Status::Unavailable(
      fmt::format("cache server on port {} is unreachable ({})", port_, what));
}

// Sends a frame's header and body with one system call (more only for a
// body larger than the socket's buffer). Sent apart, the daemon often woke
// for the header alone while this process was descheduled before the body:
// one more wake-up and a read that found nothing, per request
// (docs/spill-reads.md#single-spilled-puts-profiled-issue-36-item-4).
// Each piece waits at most timeout_ms (the socket's send timeout), however
// often signals interrupt it (see ReadAll).
static bool SendFrame(int fd, std::span<const std::byte> header, const std::string& body,
                      int timeout_ms) {
  iovec iov[2] = {{const_cast<std::byte*>(header.data()), header.size()},
                  {const_cast<char*>(body.data()), body.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  auto deadline = DeadlineIn(timeout_ms);
  while (msg.msg_iovlen > 0) {
    ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR && RetryAfterSignal(deadline)) continue;
    if (w <= 0) return false;
    deadline = DeadlineIn(timeout_ms);
    auto n = static_cast<size_t>(w);
    while (msg.msg_iovlen > 0 && n >= msg.msg_iov->iov_len) {
      n -= msg.msg_iov->iov_len;
      ++msg.msg_iov;
      --msg.msg_iovlen;
    }
    if (msg.msg_iovlen > 0) {
      msg.msg_iov->iov_base = static_cast<char*>(msg.msg_iov->iov_base) + n;
      msg.msg_iov->iov_len -= n;
    }
  }
  return true;
}

// Waits until the answer (or the close) can be read, at most until
// `deadline`: false with errno EAGAIN when it did not come. Not by sleeping
// in recvmsg(): a thread asleep there on a Unix stream socket is woken each
// time the server takes in a request it sent (space back in its send
// buffer wakes every sleeper on the socket, readers too: unix_write_space),
// and finds nothing and sleeps again, one wasted wake-up of this thread per
// request (1.2 context switches per spilled Put instead of 1.0;
// docs/spill-reads.md). poll() sleeps for input alone. A signal (EINTR)
// resumes the wait for what is left of it, not for the whole timeout again:
// a process signalled more often than its timeout (a profiler's timer) would
// otherwise wait for a stopped server forever.
static bool WaitReadable(int fd, std::chrono::steady_clock::time_point deadline) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  int r;
  do {
    r = poll(&p, 1, MsLeft(deadline));
  } while (r < 0 && errno == EINTR);
  if (r == 0) errno = EAGAIN;
  return r > 0;
}

// Reads n bytes, waiting at most timeout_ms for each piece: the socket's
// receive timeout, and a receive a signal interrupted (EINTR) is tried
// again only for what is left of that wait (then false with errno EAGAIN),
// for the reason WaitReadable gives.
static bool ReadAll(int fd, void* p, size_t n, int timeout_ms) {
  if (n == 0) return true;
  auto* c = static_cast<char*>(p);
  auto deadline = DeadlineIn(timeout_ms);
  while (n > 0) {
    ssize_t r = recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR && RetryAfterSignal(deadline)) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
    deadline = DeadlineIn(timeout_ms);
  }
  return true;
}

Status Connection::Call(protocol::MsgType type, const std::string& request,
                        std::string* body, size_t* payload_offset, int timeout_ms) {
  if (fd_ < 0) return Broken("connection closed");
  // Set again only when it changes: for a rare request (spill disk, chunk
  // return) or one that waited for another thread's; two system calls cost
  // nothing beside those.
  if (timeout_ms != timeout_ms_) {
    SetTimeouts(fd_, timeout_ms);
    timeout_ms_ = timeout_ms;
  }
  return Exchange(type, request, body, payload_offset);
}

Status Connection::Exchange(protocol::MsgType type, const std::string& request,
                            std::string* body, size_t* payload_offset) {
  protocol::FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.body_len = static_cast<uint32_t>(request.size());
  std::byte hdr[protocol::kFrameHeaderBytes];
  protocol::EncodeFrameHeader(h, hdr);
  if (!SendFrame(fd_, hdr, request, timeout_ms_)) {
    const int err = errno;
    // A server of another protocol version answers the header alone and
    // closes (server_connection.cc): what it said is read before the close
    // is reported, which a body larger than the socket's buffer met.
    if ((err == EPIPE || err == ECONNRESET) &&
        ReadAll(fd_, hdr, sizeof hdr, timeout_ms_)) {
      protocol::FrameHeader rh;
      if (Status s = protocol::DecodeFrameHeader(hdr, &rh); s.IsNotSupported()) {
        return Broken(s.message());
      }
    }
    // A request whose send failed was not whole on the socket: the server
    // read none of it, or part, and read no more.
    closed_before_request_ = err == EPIPE || err == ECONNRESET;
    return Broken(std::strerror(err));
  }
  // The answer's header and as much of its body as came with it (all of a
  // small answer: the daemon sends both with one write) in one system call.
  // Nothing follows an answer on the socket before the next request.
  body->resize(std::max<size_t>(body->size(), kFirstBodyBytes));
  iovec in[2] = {{hdr, sizeof hdr}, {body->data(), kFirstBodyBytes}};
  msghdr msg{};
  msg.msg_iov = in;
  msg.msg_iovlen = 2;
  ssize_t got = -1;
  // A receive that finds the connection closed sets no errno: what this
  // thread's earlier calls left there (an EAGAIN) is not a timeout.
  errno = 0;
  if (WaitReadable(fd_, DeadlineIn(timeout_ms_))) {
    do {
      got = recvmsg(fd_, &msg, 0);
    } while (got < 0 && errno == EINTR);
  }
  const size_t head =
      got > 0 ? std::min<size_t>(static_cast<size_t>(got), sizeof hdr) : 0;
  if (got <= 0 || !ReadAll(fd_, hdr + head, sizeof hdr - head, timeout_ms_)) {
    if (errno == EAGAIN) return Broken("timed out");
    // Sent whole: the server may have carried it out (a lease granted, a
    // session created) before it went, so it is never sent again.
    return Broken(
        "it closed the connection before it answered: it was stopped or killed while "
        "it had the request, which may have been carried out, so it is not sent again");
  }
  protocol::FrameHeader rh;
  Status s = protocol::DecodeFrameHeader(hdr, &rh);
  if (!s.ok()) return Broken(s.message());
  if (rh.type != (h.type | protocol::kResponseBit)) {
    return Broken("response does not match request");
  }
  const size_t body_got = static_cast<size_t>(got) - head;
  if (body_got > rh.body_len) return Broken("response longer than its frame");
  body->resize(rh.body_len);
  if (!ReadAll(fd_, body->data() + body_got, body->size() - body_got, timeout_ms_)) {
    return Broken("response truncated");
  }
  protocol::WireReader r(
      std::span(reinterpret_cast<const std::byte*>(body->data()), body->size()));
  Status answer = protocol::ReadStatus(r);
  if (answer.IsCorruption() && !r.ok()) return Broken(answer.message());
  *payload_offset = r.consumed();
  return answer;
}

}  // namespace shmcache
