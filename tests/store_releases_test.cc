// Releasing a finished connection's chunks (daemon/store_releases.cc): the
// unused tail of a chunk leased by a process that is gone is recycled at
// once; that of a process that runs on is not. Whether the process is gone
// is asked of the process itself (ProcessHandle), so a new process given
// its pid does not keep its chunks locked.
#include "daemon/store.h"

#include <unistd.h>

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "common/process_state.h"
#include "daemon/logger.h"
#include "tests/support/test_server.h"

namespace shmcache {
namespace {

constexpr uint64_t kConn = 1, kNextConn = 2;

// A store with one cache, in directories of its own. Usable in a forked
// child: it reports failures through Ok() rather than gtest.
class StoreWithCache {
 public:
  StoreWithCache() {
    shm_dir_ = test::MakeTempDir("/dev/shm", "shmcache-rel");
    run_dir_ = test::MakeTempDir(test::TestTmpRoot(), "rel");
    if (!log_.Open(run_dir_ + "/log", 4).ok()) return;
    DaemonOptions o;
    o.memory_cap_bytes = 256u << 20;
    paths_ = MakeInstancePaths(40003, run_dir_, shm_dir_);
    store_ = std::make_unique<Store>(o, paths_, 1, 1, &log_);
    uint32_t session = 0;
    ok_ = store_->Init().ok() && store_->CreateSession(&session).ok() &&
          store_->OpenCache(session, "c", "c-fp", 64, false, &cache_id_).ok();
  }
  ~StoreWithCache() {
    if (store_) store_->Shutdown();
    store_.reset();
    test::RemoveTree(shm_dir_);
    test::RemoveTree(run_dir_);
  }
  bool Ok() const { return ok_; }
  Store& store() { return *store_; }

  bool Lease(uint64_t conn, ChunkLease* out) {
    return store_->LeaseChunk(conn, cache_id_, 0, 1000, out).ok();
  }
  // Whether a lease for another connection is cut from `first`'s tail.
  bool NextLeaseIsTailOf(const ChunkLease& first) {
    ChunkLease next;
    if (!Lease(kNextConn, &next)) return false;
    return next.seg_no == first.seg_no && next.offset > first.offset &&
           next.offset < first.offset + first.size;
  }

 private:
  std::string shm_dir_, run_dir_;
  InstancePaths paths_;
  Logger log_;
  std::unique_ptr<Store> store_;
  uint32_t cache_id_ = 0;
  bool ok_ = false;
};

using test::KillAndReap;
using test::Sleeper;

TEST(StoreReleasesTest, ChunksOfAProcessThatIsGoneAreRecycledAtOnce) {
  StoreWithCache s;
  ASSERT_TRUE(s.Ok());
  ChunkLease first;
  ASSERT_TRUE(s.Lease(kConn, &first));
  pid_t client = Sleeper();
  auto handle = std::make_shared<const ProcessHandle>(client);
  KillAndReap(client);
  s.store().ReleaseConnection(kConn, std::move(handle));
  EXPECT_TRUE(s.NextLeaseIsTailOf(first));
}

TEST(StoreReleasesTest, AConnectionWithoutAProcessIsReleasedAtOnce) {
  StoreWithCache s;
  ASSERT_TRUE(s.Ok());
  ChunkLease first;
  ASSERT_TRUE(s.Lease(kConn, &first));
  s.store().ReleaseConnection(kConn, nullptr);
  EXPECT_TRUE(s.NextLeaseIsTailOf(first));
}

TEST(StoreReleasesTest, ChunksOfAProcessThatRunsOnStayWithIt) {
  StoreWithCache s;
  ASSERT_TRUE(s.Ok());
  ChunkLease first;
  ASSERT_TRUE(s.Lease(kConn, &first));
  pid_t client = Sleeper();
  s.store().ReleaseConnection(kConn, std::make_shared<const ProcessHandle>(client));
  EXPECT_FALSE(s.NextLeaseIsTailOf(first));
  KillAndReap(client);
}

// Exit codes of the namespace child below.
constexpr int kRecycled = 0, kSetupFailed = 1, kNotRecycled = 2, kNoPidfd = 10,
              kPidNotReused = 12;

// As pid 1 of a pid namespace: the client ends and a new process is given
// its pid before its connection's release is handled.
int ReleaseAcrossPidReuse() {
  StoreWithCache s;
  ChunkLease first;
  if (!s.Ok() || !s.Lease(kConn, &first)) return kSetupFailed;
  pid_t client = Sleeper();
  auto handle = std::make_shared<const ProcessHandle>(client);
  if (!handle->has_pidfd()) {
    KillAndReap(client);
    return kNoPidfd;
  }
  KillAndReap(client);
  pid_t other = test::SleeperWithPid(client);
  int rc = kNotRecycled;
  if (other != client) {
    rc = kPidNotReused;
  } else {
    s.store().ReleaseConnection(kConn, std::move(handle));
    if (s.NextLeaseIsTailOf(first)) rc = kRecycled;
  }
  KillAndReap(other);
  return rc;
}

TEST(StoreReleasesTest, ANewProcessWithTheSamePidDoesNotKeepTheChunks) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: a pid namespace to give a pid twice";
  int rc = test::RunInPidNamespace(ReleaseAcrossPidReuse);
  if (rc == test::kNoPidNamespace) {
    GTEST_SKIP() << "cannot make a pid and mount namespace here";
  }
  if (rc == kNoPidfd) GTEST_SKIP() << "no pidfd_open on this kernel (Linux < 5.3)";
  EXPECT_NE(rc, kSetupFailed);
  EXPECT_NE(rc, kPidNotReused) << "could not give the pid again";
  EXPECT_EQ(rc, kRecycled);
}

}  // namespace
}  // namespace shmcache
