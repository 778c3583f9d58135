// The memory cap's bounds, on fake /proc and cgroup trees.
#include "common/memory_bounds.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

namespace fs = std::filesystem;

class FakeRoot {
 public:
  FakeRoot() {
    char tmpl[] = "/tmp/memory_bounds_test.XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  ~FakeRoot() { fs::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(root_ + path).parent_path());
    std::ofstream(root_ + path) << text;
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

constexpr const char* kV2Mounts =
    "40 30 0:37 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
constexpr const char* kV1Mounts =
    "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";

TEST(MemoryBoundsTest, V2TakesTheSmallestLimitUpTheHierarchy) {
  FakeRoot r;
  r.Write("/proc/self/mountinfo", kV2Mounts);
  r.Write("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  r.Write("/sys/fs/cgroup/kubepods/memory.max", "max\n");
  r.Write("/sys/fs/cgroup/kubepods/pod1/memory.max", "1073741824\n");
  r.Write("/sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "2147483648\n");
  std::string file;
  EXPECT_EQ(CgroupMemoryLimit(r.root(), &file), 1u << 30);
  EXPECT_EQ(file, "/sys/fs/cgroup/kubepods/pod1/memory.max");
}

TEST(MemoryBoundsTest, MaxEverywhereIsNoLimit) {
  FakeRoot r;
  r.Write("/proc/self/mountinfo", kV2Mounts);
  r.Write("/proc/self/cgroup", "0::/a\n");
  r.Write("/sys/fs/cgroup/a/memory.max", "max\n");
  EXPECT_EQ(CgroupMemoryLimit(r.root(), nullptr), 0u);
}

TEST(MemoryBoundsTest, ContainerNamespaceRootHasTheLimit) {
  FakeRoot r;  // cgroupns: the container sees its cgroup as "/"
  r.Write("/proc/self/mountinfo", kV2Mounts);
  r.Write("/proc/self/cgroup", "0::/\n");
  r.Write("/sys/fs/cgroup/memory.max", "536870912\n");
  EXPECT_EQ(CgroupMemoryLimit(r.root(), nullptr), 512u << 20);
}

TEST(MemoryBoundsTest, V1MemoryLimitUnderAMountOfTheContainersOwnCgroup) {
  FakeRoot r;  // Docker on v1: the mount's root is the container's cgroup
  r.Write("/proc/self/mountinfo",
          "34 30 0:31 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  r.Write("/proc/self/cgroup", "4:memory:/docker/abc\n0::/\n");
  r.Write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "268435456\n");
  EXPECT_EQ(CgroupMemoryLimit(r.root(), nullptr), 256u << 20);
}

TEST(MemoryBoundsTest, V1UnlimitedIsNoLimit) {
  FakeRoot r;
  r.Write("/proc/self/mountinfo", kV1Mounts);
  r.Write("/proc/self/cgroup", "4:memory:/x\n");
  r.Write("/sys/fs/cgroup/memory/x/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(CgroupMemoryLimit(r.root(), nullptr), 0u);
}

TEST(MemoryBoundsTest, SmallestBoundApplies) {
  FakeRoot r;
  r.Write("/proc/self/mountinfo", kV2Mounts);
  r.Write("/proc/self/cgroup", "0::/job\n");
  r.Write("/sys/fs/cgroup/job/memory.max", "1073741824\n");
  MemoryBounds b = ComputeMemoryBounds(0.5, 0, 1ull << 40, r.root());
  EXPECT_STREQ(b.bound, kBoundCgroup);
  EXPECT_EQ(b.cap_bytes, 512u << 20);
  EXPECT_EQ(b.cgroup_limit_bytes, 1u << 30);

  b = ComputeMemoryBounds(0.5, 0, 64u << 20, r.root());
  EXPECT_STREQ(b.bound, kBoundShm);
  EXPECT_EQ(b.cap_bytes, 64u << 20);

  b = ComputeMemoryBounds(0.5, 100u << 20, 1ull << 40, r.root());
  EXPECT_STREQ(b.bound, kBoundCapMb);
  EXPECT_EQ(b.cap_bytes, 100u << 20);
}

TEST(MemoryBoundsTest, RemedyFitsWhereItRuns) {
  std::string docker =
      ShmTooSmallRemedy("/dev/shm", 64u << 20, 3ull << 30, "-r 0.8", "docker");
  EXPECT_NE(docker.find("docker run --shm-size=4g"), std::string::npos) << docker;
  std::string k8s =
      ShmTooSmallRemedy("/dev/shm", 64u << 20, 3ull << 30, "-r 0.8", "kubernetes");
  EXPECT_NE(k8s.find("medium: Memory"), std::string::npos) << k8s;
  EXPECT_NE(k8s.find("sizeLimit: 4Gi"), std::string::npos) << k8s;
  std::string host = ShmTooSmallRemedy("/dev/shm", 64u << 20, 3ull << 30, "-r 0.8", "");
  EXPECT_NE(host.find("--shm_dir"), std::string::npos) << host;
}

TEST(MemoryBoundsTest, ContainerKindFromDockerenvAndProc1Cgroup) {
  if (getenv("KUBERNETES_SERVICE_HOST")) GTEST_SKIP() << "runs in Kubernetes";
  FakeRoot r;
  r.Write("/proc/1/cgroup", "0::/\n");
  EXPECT_EQ(ContainerKind(r.root()), "");
  r.Write("/.dockerenv", "");
  EXPECT_EQ(ContainerKind(r.root()), "docker");
  FakeRoot k;
  k.Write("/proc/1/cgroup", "0::/kubepods/burstable/pod1/abc\n");
  EXPECT_EQ(ContainerKind(k.root()), "kubernetes");
}

}  // namespace
}  // namespace shmcache
