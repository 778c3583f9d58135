// Hostile clients at the socket: garbage, truncated frames, frames that
// promise a body and never send it, connections that never speak. None of
// them may stall another client or bring the daemon down.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fmt/format.h>
#include <random>

#include <gtest/gtest.h>

#include "protocol.h"
#include "rel_util.h"

namespace shmcache::reltest {
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

std::string Header(uint16_t type, uint32_t body_len, uint32_t magic = protocol::kFrameMagic,
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

// A well-behaved client does a full round of work; every call must succeed.
void GoodClientWorks(const TestDaemon& d, const RowMaker& m, uint64_t base) {
  SessionCache sc;
  ASSERT_TRUE(OpenSessionCache(d, "good", &sc).ok());
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
          std::span(reinterpret_cast<const std::byte*>(hdr), sizeof hdr), &h).ok());
      EXPECT_EQ(h.type, type | protocol::kResponseBit);
      ++answered;
    }
    close(fd);
  }
  EXPECT_GT(answered, 2500u);

  GoodClientWorks(d, m, 1000);
  EXPECT_TRUE(d.Alive()) << "the daemon died";
  fmt::print("hostile-socket figures: {} silent connections held, {} bad frames "
             "refused, {} malformed requests answered\n",
             held.size(), bad.size(), answered);
  for (int fd : held) close(fd);
  GoodClientWorks(d, m, 2000);
  EXPECT_TRUE(d.Stop().ok());
  EXPECT_TRUE(d.ShmFiles().empty());
}

}  // namespace
}  // namespace shmcache::reltest
