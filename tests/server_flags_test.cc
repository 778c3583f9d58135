// ServerFlags (server_flags.h): the flags the admin hands on to the daemon
// read back as the same values.
#include "common/server_flags.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/command_line.h"

namespace shmcache {
namespace {

// What `shmcache --start` reads and hands on; what shmcached reads back.
TEST(ServerFlagsTest, TheAdminHandsOnWhatTheDaemonReadsBack) {
  ServerFlags admin;
  CommandLine a("shmcache", "");
  std::vector<CLI::Option*> flags = AddServerFlags(a, &admin);
  ASSERT_TRUE(a.Parse({"shmcache", "-w", "3", "-l", "2", "-s", "/spill dir", "-r", "0.25",
                       "--memory_cap_mb", "64", "--shm_dir=/dev/shm", "--log_dir",
                       "/logs", "--metrics_file", "/m/x.prom", "--metrics_interval", "7"})
                  .ok());
  std::vector<std::string> args = ServerFlagArgs(flags);
  EXPECT_EQ(args.size(), 9u);
  EXPECT_EQ(args[0], "--workers=3");
  args.insert(args.begin(), "shmcached");
  ServerFlags daemon;
  CommandLine d("shmcached", "");
  AddServerFlags(d, &daemon);
  ASSERT_TRUE(d.Parse(args).ok());
  EXPECT_EQ(daemon.workers, 3);
  EXPECT_EQ(daemon.log_level, 2);
  EXPECT_EQ(daemon.spill_dir, "/spill dir");
  EXPECT_EQ(daemon.memory_cap_ratio, 0.25);
  EXPECT_EQ(daemon.memory_cap_bytes, 64u << 20);
  EXPECT_EQ(daemon.shm_dir, "/dev/shm");
  EXPECT_EQ(daemon.log_dir, "/logs");
  EXPECT_EQ(daemon.metrics_file, "/m/x.prom");
  EXPECT_EQ(daemon.metrics_interval_s, 7);
}

TEST(ServerFlagsTest, OnlyTheFlagsGivenAreHandedOn) {
  ServerFlags f;
  CommandLine cl("shmcache", "");
  std::vector<CLI::Option*> flags = AddServerFlags(cl, &f);
  ASSERT_TRUE(cl.Parse({"shmcache"}).ok());
  EXPECT_TRUE(ServerFlagArgs(flags).empty());
  EXPECT_EQ(f.memory_cap_ratio, kDefaultMemoryCapRatio);
  EXPECT_EQ(f.log_level, 1);
}

}  // namespace
}  // namespace shmcache
