// Leases through the store (daemon/store_leases.cc): a lease that waits
// for pages is answered once the store's preparers have supplied them,
// whichever node's segment the pages are in; a preparer's job that throws
// at a step under the lock ends as a failed one, and leases go on.
#include "daemon/store.h"

#include <sys/wait.h>

#include <atomic>
#include <functional>
#include <memory>
#include <new>
#include <string>

#include <gtest/gtest.h>

#include "daemon/logger.h"
#include "format/layout.h"
#include "format/shm_file.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"
#include "tests/support/wait_for.h"

namespace shmcache {
namespace {

constexpr uint64_t kMB = 1 << 20;

// Exit codes of the child below, each a step that failed.
enum : int {
  kSetUp = 10,
  kNodeOneRow = 11,
  kMarkWritten = 12,
  kTooLittle = 13,
  kNotThrown = 14,   // no job reached the step
  kStuck = 15,       // after a job that threw, a request hung
  kLease = 16,       // a lease after it was refused
  kLeftBehind = 17,  // a file of the destroyed cache is left
};

// A store of `nodes` nodes under a 256 MB cap with one session and one
// cache of `size_mb`, in the dirs of a test (InAChild).
class OneCacheStore {
 public:
  OneCacheStore(const std::string& run_dir, const std::string& shm_dir, int nodes)
      : paths_(MakeInstancePaths(40004, run_dir, shm_dir)) {
    ok_ = log_.Open(run_dir + "/log", 4).ok();
    DaemonOptions o;
    o.memory_cap_bytes = 256 * kMB;
    store_ = std::make_unique<Store>(o, paths_, nodes, 1, &log_);
  }
  // Creates the session and the cache (hooks set before); false on a
  // failed step.
  bool Start(uint64_t size_mb) {
    return ok_ && store_->Init().ok() && store_->CreateSession(&session_).ok() &&
           store_->OpenCache(session_, "c", "c-fp", size_mb, false, &cache_).ok();
  }
  Store& store() { return *store_; }
  const InstancePaths& paths() const { return paths_; }
  uint32_t session() const { return session_; }
  uint32_t cache() const { return cache_; }

 private:
  InstancePaths paths_;
  Logger log_;
  bool ok_ = false;
  std::unique_ptr<Store> store_;
  uint32_t session_ = 0, cache_ = 0;
};

// Runs `body` in a forked child with a run dir and a shm dir of its own,
// removed after: its exit code, -9 when it hung (killed at its bound).
int InAChild(
    const std::function<int(const std::string& run, const std::string& shm)>& body) {
  const std::string shm_dir = test::MakeTempDir("/dev/shm", "shmcache-leases");
  const std::string run_dir = test::MakeTempDir(test::TestTmpRoot(), "leases");
  const pid_t child = test::ForkChild([&] { return body(run_dir, shm_dir); });
  const int code = child > 0 ? test::WaitChild(child, 120) : -1;
  test::RemoveTree(shm_dir);
  test::RemoveTree(run_dir);
  return code;
}

// On a host of two nodes whose budget is used up, a writer on node 0 is
// leased the segment made ahead for node 1 and, once its first pages are
// leased, waits for the next ones. The lease waited on a supply job of
// node 1 that the store never took (it took the lease's own node's jobs
// only): the daemon's request thread waited for good, and every client
// with it. Run in a child, so that a hang is a failure, not a stuck test.
TEST(StoreLeasesTest, ALeaseWaitingForAnotherNodesPagesIsAnswered) {
  const int code = InAChild([](const std::string& run, const std::string& shm) -> int {
    OneCacheStore c(run, shm, /*nodes=*/2);
    if (!c.Start(112)) return kSetUp;
    Store& store = c.store();
    // Node 1's writer puts one 80 MB row, which it writes whole; a segment
    // of a quarter of that is made ahead for node 1, its first 18 MB
    // supplied. What is left of the budget is node 0's first segment.
    ChunkLease big;
    if (!store.LeaseChunk(1, c.cache(), 1, 80 * kMB, &big).ok()) return kNodeOneRow;
    ShmFile seg;
    if (!ShmFile::Open(c.paths().SegmentFile(c.cache(), big.seg_no), &seg).ok()) {
      return kMarkWritten;
    }
    reinterpret_cast<layout::ChunkHeader*>(seg.data() + big.offset)->used.store(big.size);
    // Node 0's writer leases 3 KB rows' chunks until the cache is full.
    uint64_t leased = 0;
    Status s;
    for (int i = 0; i < 200 && s.ok(); ++i) {
      ChunkLease l;
      s = store.LeaseChunk(2, c.cache(), 0, 3000, &l);
      if (s.ok()) leased += l.size;
    }
    store.Shutdown();
    // Its own segment, node 1's segment made ahead (22 MB), and the rest
    // of node 1's first segment: at least 28 MB.
    std::fprintf(stderr, "leased %llu bytes on node 0 before %s\n",
                 static_cast<unsigned long long>(leased), s.ToString().c_str());
    return s.IsFull() && leased >= 28 * kMB ? 0 : kTooLittle;
  });
  EXPECT_NE(code, -9) << "a lease hung";
  EXPECT_EQ(code, 0);
}

// Runs `call` in a thread and waits for it; the child _exits with kStuck
// when it waits for good.
void Answered(const std::function<void()>& call) { test::ReturnsOrExit(call, kStuck); }

// Each step of a segment job under the lock (Store::LockedStep), where a
// test throws as an allocation would (the set of running jobs, the
// cache's prepared segments).
class LockedJobStepTest : public testing::TestWithParam<Store::LockedStep> {};

// A segment job that throws at a step under the lock ends as a failed one
// and its preparer goes on: leases of 3 KB rows that fill a 64 MB cache
// (each segment after the first made ahead by a job) are answered, the
// lock is let go (another request is answered), and the cache's destroy
// leaves none of its files (the thrown job's new segment neither), and
// the store's stop ends. Thrown past the job, with the lock taken by hand,
// it ended the preparer's thread, and with it the daemon (std::terminate:
// the child ended by SIGABRT).
TEST_P(LockedJobStepTest, AJobThatThrowsUnderTheLockEndsAndLeasesGoOn) {
  const Store::LockedStep step = GetParam();
  const int code = InAChild([&](const std::string& run, const std::string& shm) -> int {
    OneCacheStore c(run, shm, /*nodes=*/1);
    std::atomic<bool> thrown{false};
    c.store().SetTestHooks({.locked_step = [&](Store::LockedStep at) {
      if (at == step && !thrown.exchange(true)) throw std::bad_alloc();
    }});
    if (!c.Start(64)) return kSetUp;
    // Leased until the cache is full. A job that failed may refuse the
    // lease that waited for it, once (a supply job's segment says why).
    uint64_t leased = 0;
    int refused = 0;
    Status s;
    for (int i = 0; i < 100000 && !s.IsFull(); ++i) {
      ChunkLease l;
      Answered([&] { s = c.store().LeaseChunk(1, c.cache(), 0, 3000, &l); });
      if (s.ok()) leased += l.size;
      if (!s.ok() && !s.IsFull() && ++refused > 1) return kLease;
    }
    std::fprintf(stderr, "leased %llu bytes, %d refused, then %s\n",
                 static_cast<unsigned long long>(leased), refused, s.ToString().c_str());
    if (!thrown) return kNotThrown;
    // The budget but for its header and first table: the failed job's
    // segment (16 MB) was given back.
    if (leased < 60 * kMB) return kTooLittle;
    bool answered = false, destroyed = false;
    Answered([&] { answered = c.store().CheckSession(c.session()).ok(); });
    Answered([&] { destroyed = c.store().DestroySession(c.session()).ok(); });
    if (!answered || !destroyed) return kStuck;
    const std::string sessions = c.paths().SessionsFile();
    for (const std::string& n : test::ListDir(shm)) {
      if (n != sessions.substr(sessions.rfind('/') + 1)) return kLeftBehind;
    }
    c.store().Shutdown();
    return 0;
  });
  EXPECT_NE(code, -9) << "hung";
  EXPECT_EQ(code, 0);
}

INSTANTIATE_TEST_SUITE_P(
    EachStep, LockedJobStepTest,
    testing::Values(Store::LockedStep::kJobTaken, Store::LockedStep::kJobFinishing),
    [](const testing::TestParamInfo<Store::LockedStep>& info) -> std::string {
      return info.param == Store::LockedStep::kJobTaken ? "Taken" : "Finishing";
    });

}  // namespace
}  // namespace shmcache
