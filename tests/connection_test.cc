// The client's end of the control socket against a scripted server in this
// process: a request goes out as one write, and an answer is read whole
// however it arrives, and only as long as its frame says.
#include "lib/connection.h"

#include <linux/sockios.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/support/child_process.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {
namespace {

constexpr auto kType = protocol::MsgType::kCheckSession;
constexpr int kTimeoutMs = 20000;

// A listening socket in a directory of its own, removed with it.
class ScriptedServer {
 public:
  // backlog: listen()'s; 0 queues one connection, and the next connect
  // waits until that one is accepted.
  explicit ScriptedServer(int backlog = 4) {
    char dir[] = "/tmp/shmcache-conn.XXXXXX";
    dir_ = mkdtemp(dir) ? dir : "";
    path_ = dir_ + "/sock";
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    ok_ = !dir_.empty() && listen_fd_ >= 0 &&
          bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
          listen(listen_fd_, backlog) == 0;
  }
  ~ScriptedServer() {
    if (fd_ >= 0) close(fd_);
    if (listen_fd_ >= 0) close(listen_fd_);
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  bool ok() const { return ok_; }
  const std::string& path() const { return path_; }
  bool Accept() {
    fd_ = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    return fd_ >= 0;
  }
  // Reads one request frame whole.
  bool ReadRequest() {
    std::array<std::byte, protocol::kFrameHeaderBytes> h;
    protocol::FrameHeader fh;
    if (!ReadAll(h.data(), h.size()) || !protocol::DecodeFrameHeader(h, &fh).ok()) {
      return false;
    }
    std::string body(fh.body_len, '\0');
    return ReadAll(body.data(), body.size());
  }
  bool Send(const std::string& bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Ends the connection from the server's side (a daemon that died).
  void Hangup() { shutdown(fd_, SHUT_RDWR); }
  // Waits until the client has read everything sent to it.
  bool Drained() const {
    return WaitFor([&] {
      int unread = -1;
      return ioctl(fd_, SIOCOUTQ, &unread) == 0 && unread == 0;
    });
  }

 private:
  bool ReadAll(void* p, size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t r = recv(fd_, c, n, 0);
      if (r <= 0) return false;
      c += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }

  std::string dir_, path_;
  int listen_fd_ = -1;
  int fd_ = -1;
  bool ok_ = false;
};

// An answer frame: header, an OK status, then `payload`.
std::string Answer(const std::string& payload) {
  std::string body = protocol::EncodeStatus(Status::OK()) + payload;
  protocol::FrameHeader h;
  h.type = static_cast<uint16_t>(kType) | protocol::kResponseBit;
  h.body_len = static_cast<uint32_t>(body.size());
  std::array<std::byte, protocol::kFrameHeaderBytes> hdr;
  protocol::EncodeFrameHeader(h, hdr.data());
  return std::string(reinterpret_cast<const char*>(hdr.data()), hdr.size()) + body;
}

Status CallOnce(Connection* conn, std::string* payload) {
  std::string body;
  size_t off = 0;
  Status s = conn->Call(kType, std::string(40, 'r'), &body, &off, kTimeoutMs);
  if (s.ok()) *payload = body.substr(off);
  return s;
}

// Connects to `server` and makes one call, which `script` answers in a
// thread of the server; *broken: whether the connection is broken after.
Status CallAnsweredBy(ScriptedServer* server, const std::function<void()>& script,
                      std::string* payload, bool* broken) {
  std::unique_ptr<Connection> conn;
  Status s = Connection::Open(server->path(), 1, kTimeoutMs, &conn);
  if (!s.ok()) return s;
  if (!server->Accept()) return Status::IOError("accept failed");
  std::thread serve(script);
  s = CallOnce(conn.get(), payload);
  serve.join();
  *broken = conn->broken();
  return s;
}

bool IsSocket(pid_t pid, uint64_t fd) {
  std::error_code ec;
  const std::string target = std::filesystem::read_symlink(
      "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd), ec);
  return !ec && target.rfind("socket:", 0) == 0;
}

// Whether syscall `nr` with these arguments sends on a socket of `pid`.
bool SendsOnSocket(pid_t pid, uint64_t nr, uint64_t fd) {
  switch (nr) {
    case SYS_sendto:
    case SYS_sendmsg:
    case SYS_sendmmsg: return true;
    case SYS_write:
    case SYS_writev:
    case SYS_pwritev: return IsSocket(pid, fd);
    default: return false;
  }
}

constexpr int kNoPtrace = 77;

// The daemon woke for a request's header alone, and went back to wait for
// its body, when the two were sent apart: one write per request (the
// client's system calls counted by ptrace in a forked child).
TEST(ConnectionTest, ARequestGoesOutAsOneWrite) {
  ScriptedServer server;
  ASSERT_TRUE(server.ok());
  pid_t child = ForkChild([&]() -> int {
    std::unique_ptr<Connection> conn;
    if (!Connection::Open(server.path(), 1, kTimeoutMs, &conn).ok()) return 2;
    if (ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) != 0) return kNoPtrace;
    raise(SIGSTOP);
    std::string payload;
    return CallOnce(conn.get(), &payload).ok() && payload == "p" ? 0 : 3;
  });
  ASSERT_GT(child, 0);
  ASSERT_TRUE(server.Accept());
  std::thread serve([&] {
    if (server.ReadRequest()) server.Send(Answer("p"));
  });
  int ws = 0;
  ASSERT_EQ(waitpid(child, &ws, 0), child);
  // ptrace takes its integer arguments as pointers.
  auto arg = [](uintptr_t v) {
    return reinterpret_cast<void*>(v);  // NOLINT(performance-no-int-to-ptr)
  };
  int sends = 0;
  if (WIFSTOPPED(ws)) {
    ptrace(PTRACE_SETOPTIONS, child, nullptr,
           arg(PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL));
    int deliver = 0;
    while (ptrace(PTRACE_SYSCALL, child, nullptr, arg(static_cast<uintptr_t>(deliver))) ==
               0 &&
           waitpid(child, &ws, 0) == child && WIFSTOPPED(ws)) {
      deliver = 0;
      if (WSTOPSIG(ws) != (SIGTRAP | 0x80)) {
        deliver = WSTOPSIG(ws);  // a signal for the child: passed on
        continue;
      }
      __ptrace_syscall_info info{};
      if (ptrace(PTRACE_GET_SYSCALL_INFO, child, arg(sizeof info), &info) > 0 &&
          info.op == PTRACE_SYSCALL_INFO_ENTRY &&
          SendsOnSocket(child, info.entry.nr, info.entry.args[0])) {
        ++sends;
      }
    }
  }
  serve.join();
  ASSERT_TRUE(WIFEXITED(ws)) << DescribeStatus(ws);
  if (WEXITSTATUS(ws) == kNoPtrace) GTEST_SKIP() << "ptrace is not allowed here";
  ASSERT_EQ(WEXITSTATUS(ws), 0);
  EXPECT_EQ(sends, 1);
}

// The answer's header and body in pieces, each sent once the client read
// the one before: read whole, a body longer than the first read included.
TEST(ConnectionTest, AnAnswerInPiecesIsReadWhole) {
  ScriptedServer server;
  ASSERT_TRUE(server.ok());
  std::string payload(3 * 4096 + 5, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7);
  const std::string answer = Answer(payload);
  bool served = false;
  auto script = [&] {
    if (!server.ReadRequest()) return;
    const size_t cuts[] = {0, 7, protocol::kFrameHeaderBytes + 3, 5000, answer.size()};
    for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
      if (!server.Send(answer.substr(cuts[k], cuts[k + 1] - cuts[k])) ||
          !server.Drained()) {
        return;
      }
    }
    served = true;
  };
  std::string got;
  bool broken = true;
  Status s = CallAnsweredBy(&server, script, &got, &broken);
  ASSERT_TRUE(served);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got, payload);
  EXPECT_FALSE(broken);
}

// Bytes after the answer's frame would be read as the next answer's header:
// the connection is broken at once instead.
TEST(ConnectionTest, AnAnswerLongerThanItsFrameBreaksTheConnection) {
  ScriptedServer server;
  ASSERT_TRUE(server.ok());
  std::string got;
  bool broken = false;
  Status s = CallAnsweredBy(
      &server,
      [&] {
        if (server.ReadRequest()) server.Send(Answer("p") + "trailing");
      },
      &got, &broken);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("longer than its frame"), std::string::npos) << s.ToString();
  EXPECT_TRUE(broken);
}

// A server that ends the connection without answering (it died) is a
// closed connection, whatever errno the calling thread held from its own
// earlier calls: an EAGAIN left there (a non-blocking socket of the
// trainer's) was reported as "timed out", which sends the user to the
// timeout rather than to the server.
TEST(ConnectionTest, AServerThatHangsUpIsAClosedConnectionNotATimeout) {
  ScriptedServer server;
  ASSERT_TRUE(server.ok());
  std::string got;
  bool broken = false;
  errno = EAGAIN;
  Status s = CallAnsweredBy(
      &server,
      [&] {
        if (server.ReadRequest()) server.Hangup();
      },
      &got, &broken);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("closed the connection before it answered"),
            std::string::npos)
      << s.ToString();
  EXPECT_TRUE(broken);
}

// A process signalled more often than its request timeout (a profiler's
// timer, a training loop's alarm) still sees the timeout fire when the
// server does not answer (stopped, hung): a wait a signal interrupted goes
// on for what is left of it, not for the whole timeout again. Before, the
// asking thread waited for as long as the signals came.
TEST(ConnectionTest, ATimeoutFiresWhileSignalsKeepInterruptingTheWait) {
  ScriptedServer server;
  ASSERT_TRUE(server.ok());
  struct sigaction wake {};
  wake.sa_handler = [](int) {};  // only interrupts: no SA_RESTART
  sigemptyset(&wake.sa_mask);
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGUSR1, &wake, &before), 0);
  std::unique_ptr<Connection> conn;
  ASSERT_TRUE(Connection::Open(server.path(), 1, kTimeoutMs, &conn).ok());
  ASSERT_TRUE(server.Accept());
  std::atomic<bool> done{false};
  Status s;
  std::thread asking([&] {
    std::string body;
    size_t off = 0;
    s = conn->Call(kType, std::string(40, 'r'), &body, &off, 200);
    done.store(true);
  });
  // The request is read and never answered; the asking thread is signalled
  // about every millisecond until its call returns (or the bound passes).
  ASSERT_TRUE(server.ReadRequest());
  const bool returned = WaitFor([&] {
    if (done.load()) return true;
    pthread_kill(asking.native_handle(), SIGUSR1);
    return false;
  });
  asking.join();  // after the bound the signals stop, and the call ends
  sigaction(SIGUSR1, &before, nullptr);
  EXPECT_TRUE(returned) << "the call waited for as long as signals came";
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.ToString();
  EXPECT_TRUE(conn->broken());
}

// A client socket connected to `path`, or -1.
int ConnectRaw(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

// Whether thread `tid` of this process is asleep in connect().
bool InConnect(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  return static_cast<bool>(f >> nr) && nr == SYS_connect;
}

// Connection::Open in a thread of its own, against a server whose backlog
// is full, its thread sent SIGUSR1 (which only interrupts: no SA_RESTART)
// whenever it is asleep in connect().
class SignalledConnect {
 public:
  SignalledConnect(const std::string& path, int timeout_ms) {
    struct sigaction wake {};
    wake.sa_handler = [](int) {};
    sigemptyset(&wake.sa_mask);
    sigaction(SIGUSR1, &wake, &before_);
    thread_ = std::thread([this, path, timeout_ms] {
      tid_.store(static_cast<pid_t>(syscall(SYS_gettid)));
      status_ = Connection::Open(path, 1, timeout_ms, &conn_);
      done_.store(true);
    });
  }
  ~SignalledConnect() {
    if (thread_.joinable()) thread_.join();
    sigaction(SIGUSR1, &before_, nullptr);
  }
  // Signals the connecting thread `times` times, each while it is in
  // connect(); false when the bound passed first. Stops when Open returns.
  bool Interrupt(int times) {
    int sent = 0;
    return WaitFor([&] {
      if (done_.load()) return true;
      const pid_t tid = tid_.load();
      if (tid > 0 && InConnect(tid)) {
        pthread_kill(thread_.native_handle(), SIGUSR1);
        ++sent;
      }
      return sent >= times;
    });
  }
  // Keeps signalling it until Open returns; false when the bound passed.
  bool InterruptUntilDone() {
    return WaitFor([&] {
      if (done_.load()) return true;
      pthread_kill(thread_.native_handle(), SIGUSR1);
      return false;
    });
  }
  Status Join() {
    thread_.join();
    return status_;
  }

 private:
  struct sigaction before_ {};
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> done_{false};
  std::unique_ptr<Connection> conn_;
  Status status_;
  std::thread thread_;
};

// A signal that interrupts the connect (the server's backlog full: it is
// busy, or starting to accept) is not a server that is not running: the
// connect goes on. Before, the first signal failed it with "not running
// (Interrupted system call)", and the Python package gave up on the cache
// for the rest of the run.
TEST(ConnectionTest, ASignalWhileConnectingDoesNotFailTheConnect) {
  ScriptedServer server(/*backlog=*/0);
  ASSERT_TRUE(server.ok());
  const int filler = ConnectRaw(server.path());  // the one the backlog holds
  ASSERT_GE(filler, 0);
  SignalledConnect connecting(server.path(), kTimeoutMs);
  EXPECT_TRUE(connecting.Interrupt(20));
  ASSERT_TRUE(server.Accept());  // room in the backlog: the connect completes
  Status s = connecting.Join();
  close(filler);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// A server that never takes the connection, and a process signalled more
// often than its timeout: the connect ends at the request's timeout, and
// says it timed out, not that no server runs (a start would be refused:
// one listens). Before, a signal ended it at once as "not running
// (Interrupted system call)".
TEST(ConnectionTest, AConnectTimesOutWhileSignalsKeepInterruptingIt) {
  ScriptedServer server(/*backlog=*/0);
  ASSERT_TRUE(server.ok());
  const int filler = ConnectRaw(server.path());
  ASSERT_GE(filler, 0);
  SignalledConnect connecting(server.path(), 200);
  EXPECT_TRUE(connecting.InterruptUntilDone())
      << "the connect waited for as long as signals came";
  Status s = connecting.Join();
  close(filler);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("did not accept the connection within 200 ms"),
            std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace shmcache::test
