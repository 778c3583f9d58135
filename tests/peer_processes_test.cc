// PeerProcesses (daemon/peer_processes.h): one handle per client process,
// shared by its connections; a process that is gone is never handed out
// for a new one with its pid.
#include "daemon/peer_processes.h"

#include <unistd.h>

#include <vector>

#include <gtest/gtest.h>

#include "tests/support/test_server.h"

namespace shmcache {
namespace {

using test::KillAndReap;
using test::Sleeper;

TEST(PeerProcessesTest, ConnectionsOfOneProcessShareItsHandle) {
  PeerProcesses peers;
  pid_t client = Sleeper();
  auto a = peers.Hold(client);
  auto b = peers.Hold(client);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(a->pid(), client);
  EXPECT_EQ(peers.size(), 1u);
  auto self = peers.Hold(getpid());
  EXPECT_NE(self.get(), a.get());
  EXPECT_EQ(peers.size(), 2u);
  KillAndReap(client);
}

TEST(PeerProcessesTest, AProcessThatIsGoneIsNotHandedOutAgain) {
  PeerProcesses peers;
  pid_t client = Sleeper();
  auto old = peers.Hold(client);
  KillAndReap(client);
  ASSERT_TRUE(old->Gone());
  // The next connection with this pid (once the kernel gives it again) is
  // another process: it gets a handle of its own.
  auto next = peers.Hold(client);
  EXPECT_NE(next.get(), old.get());
}

TEST(PeerProcessesTest, HandlesNoConnectionHoldsAreForgotten) {
  PeerProcesses peers;
  std::vector<pid_t> clients;
  for (int i = 0; i < 100; ++i) clients.push_back(Sleeper());
  for (pid_t c : clients) peers.Hold(c);  // each dropped at once
  EXPECT_EQ(peers.size(), 0u);
  EXPECT_LT(peers.tracked(), clients.size());
  auto kept = peers.Hold(clients.front());
  EXPECT_EQ(peers.size(), 1u);
  EXPECT_EQ(peers.Hold(clients.front()).get(), kept.get());
  for (pid_t c : clients) KillAndReap(c);
}

}  // namespace
}  // namespace shmcache
