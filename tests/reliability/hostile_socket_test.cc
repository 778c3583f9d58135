// Hostile clients at the socket: garbage, truncated frames, frames that
// promise a body and never send it, connections that never speak, more
// connections than the daemon has descriptors. None of them may stall
// another client, pin the daemon's memory, make it spin, or bring it down.
#include <dirent.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "format/protocol.h"
#include "tests/support/checked_rows.h"
#include "tests/support/test_daemon.h"

namespace shmcache::test {
namespace {

std::string SocketPath(const TestDaemon& d) {
  return fmt::format("{}/shmcached-{}.sock", d.run_dir(), d.port());
}

int RawConnect(const TestDaemon& d) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::string p = SocketPath(d);
  std::memcpy(a.sun_path, p.c_str(), p.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& b) {
  return send(fd, b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size());
}

std::string Header(uint16_t type, uint32_t body_len,
                   uint32_t magic = protocol::kFrameMagic,
                   uint16_t version = protocol::kProtocolVersion) {
  protocol::FrameHeader h;
  h.magic = magic;
  h.version = version;
  h.type = type;
  h.body_len = body_len;
  std::string out(protocol::kFrameHeaderBytes, '\0');
  protocol::EncodeFrameHeader(h, reinterpret_cast<std::byte*>(out.data()));
  return out;
}

// True when the daemon closed `fd` (EOF or reset) within the bound.
bool ClosedByPeer(int fd, int ms = 5000) {
  char buf[256];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;  // responses before the close are read and dropped
  }
  return false;
}

// True when a request of `type` sent on `fd` is answered within 5 s.
bool Answered(int fd, uint16_t type, const std::string& body = "") {
  if (!SendAll(fd, Header(type, static_cast<uint32_t>(body.size())) + body)) {
    return false;
  }
  char hdr[protocol::kFrameHeaderBytes];
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 5000) != 1 || recv(fd, hdr, sizeof hdr, MSG_WAITALL) != sizeof hdr) {
    return false;
  }
  protocol::FrameHeader h;
  return protocol::DecodeFrameHeader(
             std::span(reinterpret_cast<const std::byte*>(hdr), sizeof hdr), &h)
             .ok() &&
         h.type == (type | protocol::kResponseBit);
}

// Bytes sent on `fd` that the peer has not read yet.
int Unread(int fd) {
  int n = -1;
  return ioctl(fd, SIOCOUTQ, &n) == 0 ? n : -1;
}

// A field of /proc/<pid>/status in kB (VmRSS, ...); -1 when absent.
long StatusKb(pid_t pid, const std::string& field) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

// CPU time (user + system) a process has used, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

size_t OpenFds(pid_t pid) {
  size_t n = 0;
  if (DIR* d = opendir(fmt::format("/proc/{}/fd", pid).c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

// A well-behaved client does a full round of work; every call must succeed.
void GoodClientWorks(const TestDaemon& d, const RowMaker& m, uint64_t base) {
  SessionCache sc;
  Status opened = OpenSessionCache(d, "good", &sc);
  ASSERT_TRUE(opened.ok()) << opened.ToString();
  std::unique_ptr<Client>& c = sc.client;
  const uint32_t sid = sc.session;
  std::unique_ptr<Cache>& cache = sc.cache;
  Row row;
  for (uint64_t id = base; id < base + 200; ++id) {
    ASSERT_TRUE(m.Put(*cache, id).ok());
    ASSERT_TRUE(cache->Get(id, &row).ok());
    ASSERT_EQ(m.Verify(id, row.view()), "");
  }
  std::vector<SessionInfo> list;
  ASSERT_TRUE(c->ListSessions(&list).ok());
  cache.reset();
  ASSERT_TRUE(c->DestroySession(sid).ok());
}

TEST(HostileSocket, GarbageAndSilenceNeverStallOthersNorCrashTheDaemon) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  RowMaker m(4096);
  std::vector<int> held;

  // Connections that never speak, many of them.
  for (int i = 0; i < 200; ++i) {
    int fd = RawConnect(d);
    ASSERT_GE(fd, 0);
    held.push_back(fd);
  }
  // A header promising a 64 MB body, then nothing.
  int big = RawConnect(d);
  ASSERT_TRUE(SendAll(big, Header(2, protocol::kMaxBodyBytes)));
  held.push_back(big);
  // A truncated header, then nothing.
  int half = RawConnect(d);
  ASSERT_TRUE(SendAll(half, Header(1, 4).substr(0, 7)));
  held.push_back(half);
  // A body cut short, then nothing.
  int cut = RawConnect(d);
  ASSERT_TRUE(SendAll(cut, Header(5, 100) + std::string(10, 'x')));
  held.push_back(cut);

  GoodClientWorks(d, m, 0);

  // Frames the daemon must refuse by closing the connection.
  struct Bad {
    const char* what;
    std::string bytes;
  };
  std::mt19937 rng(7);
  std::string noise(4096, '\0');
  for (char& ch : noise) ch = static_cast<char>(rng());
  std::vector<Bad> bad = {
      {"random bytes", noise},
      {"bad magic", Header(1, 4, 0xdeadbeef) + "abcd"},
      {"bad version", Header(1, 4, protocol::kFrameMagic, 99) + "abcd"},
      {"unknown type", Header(999, 0)},
      {"type zero", Header(0, 0)},
      {"oversized body", Header(2, protocol::kMaxBodyBytes + 1)},
      {"response bit", Header(1 | protocol::kResponseBit, 0)},
  };
  for (const Bad& b : bad) {
    int fd = RawConnect(d);
    ASSERT_GE(fd, 0) << b.what;
    ASSERT_TRUE(SendAll(fd, b.bytes)) << b.what;
    EXPECT_TRUE(ClosedByPeer(fd)) << b.what << ": the daemon kept the connection";
    close(fd);
  }

  // Well-framed requests with malformed bodies: answered with an error, and
  // the connection stays usable.
  uint64_t answered = 0;
  for (int i = 0; i < 3000; ++i) {
    uint16_t type = static_cast<uint16_t>(1 + rng() % protocol::kMaxMsgType);
    if (type == static_cast<uint16_t>(protocol::MsgType::kStop)) continue;
    std::string body(rng() % 64, '\0');
    for (char& ch : body) ch = static_cast<char>(rng());
    int fd = RawConnect(d);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, Header(type, static_cast<uint32_t>(body.size())) + body));
    char hdr[protocol::kFrameHeaderBytes];
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) == 1 && recv(fd, hdr, sizeof hdr, MSG_WAITALL) == sizeof hdr) {
      protocol::FrameHeader h;
      ASSERT_TRUE(protocol::DecodeFrameHeader(
                      std::span(reinterpret_cast<const std::byte*>(hdr), sizeof hdr), &h)
                      .ok());
      EXPECT_EQ(h.type, type | protocol::kResponseBit);
      ++answered;
    }
    close(fd);
  }
  EXPECT_GT(answered, 2500u);

  GoodClientWorks(d, m, 1000);
  EXPECT_TRUE(d.Alive()) << "the daemon died";
  fmt::print(
      "hostile-socket figures: {} silent connections held, {} bad frames "
      "refused, {} malformed requests answered\n",
      held.size(), bad.size(), answered);
  for (int fd : held) close(fd);
  GoodClientWorks(d, m, 2000);
  EXPECT_TRUE(d.Stop().ok());
  EXPECT_TRUE(d.ShmFiles().empty());
}

// Reads one answer (its header and body) from `fd` within 5 s: the type of
// the request it answers, or 0 when none came whole.
uint16_t AnswerType(int fd) {
  char hdr[protocol::kFrameHeaderBytes];
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 5000) != 1 || recv(fd, hdr, sizeof hdr, MSG_WAITALL) != sizeof hdr) {
    return 0;
  }
  protocol::FrameHeader h;
  if (!protocol::DecodeFrameHeader(
           std::span(reinterpret_cast<const std::byte*>(hdr), sizeof hdr), &h)
           .ok()) {
    return 0;
  }
  std::string body(h.body_len, '\0');
  if (h.body_len > 0 && recv(fd, body.data(), body.size(), MSG_WAITALL) !=
                            static_cast<ssize_t>(body.size())) {
    return 0;
  }
  return static_cast<uint16_t>(h.type & ~protocol::kResponseBit);
}

// The daemon reads a frame's header with as much of its body as came
// (server_connection.h): bytes beyond one frame are the next frame's start,
// whether they came with it, byte by byte, or split anywhere. None of this
// library's clients sends a request before the last one's answer; a
// client that does gets every answer, in order.
TEST(HostileSocket, FramesSentBackToBackOrInPiecesAreAnsweredInOrder) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  const uint16_t kList = static_cast<uint16_t>(protocol::MsgType::kListSessions);
  const uint16_t kInfo = static_cast<uint16_t>(protocol::MsgType::kServerInfo);
  int fd = RawConnect(d);
  ASSERT_GE(fd, 0);
  // Two frames in one send, then three.
  ASSERT_TRUE(SendAll(fd, Header(kList, 0) + Header(kInfo, 0)));
  EXPECT_EQ(AnswerType(fd), kList);
  EXPECT_EQ(AnswerType(fd), kInfo);
  ASSERT_TRUE(SendAll(fd, Header(kInfo, 0) + Header(kList, 0) + Header(kInfo, 0)));
  EXPECT_EQ(AnswerType(fd), kInfo);
  EXPECT_EQ(AnswerType(fd), kList);
  EXPECT_EQ(AnswerType(fd), kInfo);
  // A frame byte by byte.
  for (char ch : Header(kList, 0)) ASSERT_TRUE(SendAll(fd, std::string(1, ch)));
  EXPECT_EQ(AnswerType(fd), kList);
  // A frame with a body larger than what is read with its header (an
  // error answer: the body is no request of that type), the next frame
  // behind it in the same send, and a third split inside its header.
  std::string body(10000, 'x');
  const std::string third = Header(kList, 0);
  ASSERT_TRUE(SendAll(fd, Header(kList, static_cast<uint32_t>(body.size())) + body +
                              Header(kInfo, 0) + third.substr(0, 5)));
  EXPECT_EQ(AnswerType(fd), kList);
  EXPECT_EQ(AnswerType(fd), kInfo);
  ASSERT_TRUE(SendAll(fd, third.substr(5)));
  EXPECT_EQ(AnswerType(fd), kList);
  // A frame with a body cut in two at each of its byte boundaries, the
  // first piece taken (read alone) before the second, with a frame behind
  // it, is sent: answered once each.
  const std::string frame = Header(kList, 24) + std::string(24, 'x');
  for (size_t cut = 1; cut < frame.size(); ++cut) {
    ASSERT_TRUE(SendAll(fd, frame.substr(0, cut)));
    ASSERT_TRUE(WaitFor([&] { return Unread(fd) == 0; })) << cut;
    ASSERT_TRUE(SendAll(fd, frame.substr(cut) + Header(kInfo, 0)));
    ASSERT_EQ(AnswerType(fd), kList) << cut;
    ASSERT_EQ(AnswerType(fd), kInfo) << cut;
  }
  // The connection serves as before.
  EXPECT_TRUE(Answered(fd, kInfo));
  close(fd);
  EXPECT_TRUE(d.Alive());
  EXPECT_TRUE(d.Stop().ok());
}

// A client that sends requests back to back and never reads the answers:
// once the socket's buffers are full the daemon's send of an answer takes
// what fits and leaves the rest to wait for writability (the socket is
// non-blocking: server_connection.cc), so no thread of the daemon is held
// in a send and others are served meanwhile; the connection, stalled in an
// answer, is closed after the stall timeout.
TEST(HostileSocket, AnswersNobodyReadsHoldNoThreadOfTheDaemon) {
  TestDaemon d;
  TestDaemon::Options o;
  o.extra_args = {"--stall_timeout_ms=1000"};
  ASSERT_TRUE(d.Start(o).ok());
  const uint16_t kInfo = static_cast<uint16_t>(protocol::MsgType::kServerInfo);
  int fd = RawConnect(d);
  ASSERT_GE(fd, 0);
  // Requests until this side's send buffer is full too: the daemon stopped
  // reading them, its answers having filled the socket the other way. A
  // frame's 16 bytes are taken whole or not at all.
  const std::string frame = Header(kInfo, 0);
  size_t sent = 0;
  bool full = false;
  while (!full && sent < 1000000) {
    const ssize_t n = send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(frame.size())) {
      ++sent;
      continue;
    }
    ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << n;
    // Full for good once the daemon takes nothing more for a while.
    full = !WaitFor([&] { return Unread(fd) == 0; }, std::chrono::milliseconds(500));
  }
  ASSERT_TRUE(full) << sent << " requests all taken";
  // Served meanwhile, by as many threads as the daemon has.
  RowMaker m(4096);
  for (int i = 0; i < 4; ++i) GoodClientWorks(d, m, 1000 * static_cast<uint64_t>(i));
  // Nothing read meanwhile (a read is progress): the close is seen as the
  // hang-up it leaves on this end.
  EXPECT_TRUE(WaitFor(
      [&] {
        pollfd p{fd, POLLRDHUP, 0};
        return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
      },
      std::chrono::seconds(30)))
      << "a connection stalled in its answers held on";
  EXPECT_EQ(Count(d.ReadLog(), "stalled in the middle of a frame"), 1u) << d.ReadLog();
  close(fd);
  EXPECT_TRUE(d.Alive());
  EXPECT_TRUE(d.Stop().ok());
}

TEST(HostileSocket, FramesAnnouncingLargeBodiesHoldOnlyWhatWasSent) {
  TestDaemon d;
  ASSERT_TRUE(d.Start().ok());
  const long rss_before = StatusKb(d.pid(), "VmRSS");
  // 30 headers announcing the largest body, then nothing.
  std::vector<int> held;
  for (int i = 0; i < 30; ++i) {
    int fd = RawConnect(d);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, Header(12, protocol::kMaxBodyBytes)));
    held.push_back(fd);
  }
  // The daemon has read every header...
  ASSERT_TRUE(WaitFor(
      [&] {
        return std::all_of(held.begin(), held.end(),
                           [](int fd) { return Unread(fd) == 0; });
      },
      std::chrono::seconds(20)));
  // ...and goes on serving others.
  RowMaker m(4096);
  GoodClientWorks(d, m, 0);
  const long rss = StatusKb(d.pid(), "VmRSS");
  fmt::print(
      "large-announcement figures: daemon RSS {} MB before, {} MB with {} "
      "connections each announcing {} MB\n",
      rss_before >> 10, rss >> 10, held.size(), protocol::kMaxBodyBytes >> 20);
  EXPECT_LT(rss, 100L << 10) << "kB resident: the announced bodies were allocated";
  for (int fd : held) close(fd);
  EXPECT_TRUE(d.Stop().ok());
}

TEST(HostileSocket, AConnectionStalledInAFrameIsClosedAndAnIdleOneIsNot) {
  TestDaemon d;
  TestDaemon::Options o;
  o.extra_args = {"--stall_timeout_ms=300"};
  ASSERT_TRUE(d.Start(o).ok());
  int idle = RawConnect(d);  // says nothing, before and during the stalls
  ASSERT_GE(idle, 0);
  int half_header = RawConnect(d);
  ASSERT_TRUE(SendAll(half_header, Header(9, 0).substr(0, 7)));
  int half_body = RawConnect(d);
  ASSERT_TRUE(SendAll(half_body, Header(12, 1000) + std::string(100, 'x')));
  EXPECT_TRUE(ClosedByPeer(half_header, 20000)) << "a half-sent header held on";
  EXPECT_TRUE(ClosedByPeer(half_body, 20000)) << "a half-sent body held on";
  // The idle connection is older than the stalls and still served.
  EXPECT_TRUE(Answered(idle, 9));
  EXPECT_EQ(Count(d.ReadLog(), "stalled in the middle of a frame"), 2u) << d.ReadLog();
  for (int fd : {idle, half_header, half_body}) close(fd);
  EXPECT_TRUE(d.Stop().ok());
}

TEST(HostileSocket, BodiesBeingReadStayUnderTheDaemonsCap) {
  TestDaemon d;
  TestDaemon::Options o;
  o.extra_args = {"--body_bytes_cap_mb=16"};
  ASSERT_TRUE(d.Start(o).ok());
  // A holds 6 MB of a body and stops: its buffer has grown to 8 MB.
  int a = RawConnect(d);
  ASSERT_TRUE(
      SendAll(a, Header(12, protocol::kMaxBodyBytes) + std::string(6 << 20, 'a')));
  // B's body would need 16 MB more: B is closed, A is not touched.
  int b = RawConnect(d);
  SendAll(b, Header(12, protocol::kMaxBodyBytes) + std::string(12 << 20, 'b'));
  EXPECT_TRUE(ClosedByPeer(b, 20000)) << "no cap on bodies being read";
  EXPECT_EQ(Count(d.ReadLog(), "the cap of all connections together"), 1u) << d.ReadLog();
  RowMaker m(4096);
  GoodClientWorks(d, m, 0);  // small requests still fit
  close(a);
  close(b);
  // With A gone, a body as large as B's is read whole and answered.
  const std::string large(12 << 20, 'c');
  EXPECT_TRUE(WaitFor(
      [&] {
        int fd = RawConnect(d);
        bool answered = fd >= 0 && Answered(fd, 12, large);
        if (fd >= 0) close(fd);
        return answered;
      },
      std::chrono::seconds(20)));
  EXPECT_TRUE(d.Stop().ok());
}

TEST(HostileSocket, OutOfDescriptorsTheDaemonWaitsInsteadOfSpinning) {
  TestDaemon d;
  TestDaemon::Options o;
  o.fd_limit = 64;
  ASSERT_TRUE(d.Start(o).ok());
  // More connections than the daemon may hold: the rest wait in the
  // listen backlog, and every accept fails until some close.
  std::vector<int> held;
  for (int i = 0; i < 100; ++i) {
    int fd = RawConnect(d);
    ASSERT_GE(fd, 0) << i;
    held.push_back(fd);
  }
  ASSERT_TRUE(WaitFor([&] { return OpenFds(d.pid()) >= 64; }, std::chrono::seconds(20)))
      << OpenFds(d.pid()) << " descriptors open";
  // A measuring window: how much CPU the daemon burns while it cannot
  // accept. Spinning on accept costs a whole core; backing off, next to none.
  const double cpu0 = CpuSeconds(d.pid());
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double cpu = CpuSeconds(d.pid()) - cpu0;
  const double window =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("descriptor-exhaustion figures: {:.3f} s of CPU in a {:.2f} s window\n", cpu,
             window);
  EXPECT_LT(cpu, 0.3 * window) << "the daemon spins on failing accepts";
  for (int fd : held) close(fd);
  // Served again once descriptors are free.
  EXPECT_TRUE(WaitFor(
      [&] {
        std::unique_ptr<Client> c;
        uint32_t sid = 0;
        return Client::Connect(d.client_options(), &c).ok() &&
               c->CreateSession(&sid).ok();
      },
      std::chrono::seconds(30)));
  // Each time accepting fails it says so once, and once when it works
  // again (not once per failed attempt). It can be more than one episode:
  // while the daemon closes the connections ended above, the ones still
  // queued in the backlog may fill the freed descriptors again. Our client
  // was queued last, so once it was served no episode is still open.
  std::string log = d.ReadLog();
  const size_t failing = Count(log, "cannot accept connections");
  EXPECT_GE(failing, 1u) << log;
  EXPECT_EQ(Count(log, "accepting connections again"), failing) << log;
  EXPECT_TRUE(d.Stop().ok());
}

}  // namespace
}  // namespace shmcache::test
