// Leases through the store (daemon/store_leases.cc): a lease that waits
// for pages is answered once the store's preparers have supplied them,
// whichever node's segment the pages are in.
#include "daemon/store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "daemon/logger.h"
#include "format/layout.h"
#include "format/shm_file.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"

namespace shmcache {
namespace {

constexpr uint64_t kMB = 1 << 20;

// Exit codes of the child below, each a step that failed.
enum : int { kSetUp = 10, kNodeOneRow = 11, kMarkWritten = 12, kTooLittle = 13 };

// On a host of two nodes whose budget is used up, a writer on node 0 is
// leased the segment made ahead for node 1 and, once its first pages are
// leased, waits for the next ones. The lease waited on a supply job of
// node 1 that the store never took (it took the lease's own node's jobs
// only): the daemon's request thread waited for good, and every client
// with it. Run in a child, so that a hang is a failure, not a stuck test.
TEST(StoreLeasesTest, ALeaseWaitingForAnotherNodesPagesIsAnswered) {
  const std::string shm_dir = test::MakeTempDir("/dev/shm", "shmcache-leases");
  const std::string run_dir = test::MakeTempDir(test::TestTmpRoot(), "leases");
  const pid_t child = test::ForkChild([&]() -> int {
    Logger log;
    if (!log.Open(run_dir + "/log", 4).ok()) return kSetUp;
    DaemonOptions o;
    o.memory_cap_bytes = 256 * kMB;
    const InstancePaths paths = MakeInstancePaths(40004, run_dir, shm_dir);
    Store store(o, paths, /*num_nodes=*/2, 1, &log);
    uint32_t session = 0, cache = 0;
    if (!store.Init().ok() || !store.CreateSession(&session).ok() ||
        !store.OpenCache(session, "c", "c-fp", 112, false, &cache).ok()) {
      return kSetUp;
    }
    // Node 1's writer puts one 80 MB row, which it writes whole; a segment
    // of a quarter of that is made ahead for node 1, its first 18 MB
    // supplied. What is left of the budget is node 0's first segment.
    ChunkLease big;
    if (!store.LeaseChunk(1, cache, 1, 80 * kMB, &big).ok()) return kNodeOneRow;
    ShmFile seg;
    if (!ShmFile::Open(paths.SegmentFile(cache, big.seg_no), &seg).ok()) {
      return kMarkWritten;
    }
    reinterpret_cast<layout::ChunkHeader*>(seg.data() + big.offset)->used.store(big.size);
    // Node 0's writer leases 3 KB rows' chunks until the cache is full.
    uint64_t leased = 0;
    Status s;
    for (int i = 0; i < 200 && s.ok(); ++i) {
      ChunkLease l;
      s = store.LeaseChunk(2, cache, 0, 3000, &l);
      if (s.ok()) leased += l.size;
    }
    store.Shutdown();
    // Its own segment, node 1's segment made ahead (22 MB), and the rest
    // of node 1's first segment: at least 28 MB.
    std::fprintf(stderr, "leased %llu bytes on node 0 before %s\n",
                 static_cast<unsigned long long>(leased), s.ToString().c_str());
    return s.IsFull() && leased >= 28 * kMB ? 0 : kTooLittle;
  });
  ASSERT_GT(child, 0);
  const int code = test::WaitChild(child, 120);
  test::RemoveTree(shm_dir);
  test::RemoveTree(run_dir);
  EXPECT_NE(code, -9) << "a lease hung";
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace shmcache
