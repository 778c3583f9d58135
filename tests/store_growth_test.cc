// Index growth through the store (Store::GrowIndex, daemon/
// store_leases.cc): the new table is made with the store's lock let go, so
// other requests go on meanwhile; a second growth of the same cache and
// the cache's destruction wait for it, and so do spilled rows (whose
// publish may grow the index); a cache the cap made full between its steps
// takes rows again after it; a growth that throws, at a step with the
// lock or without, ends (a failed one, or, thrown once its table was
// added, a done one) and leaves the lock free; a daemon killed while it
// makes the table leaves an index the next one adopts whole.
//
// Each store runs in a forked child, so that a hang is a failure (the
// child is killed at its bound), not a stuck test.
#include "daemon/store.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/logger.h"
#include "format/align.h"
#include "format/index_table.h"
#include "format/layout.h"
#include "format/shm_file.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"
#include "tests/support/wait_for.h"

namespace shmcache {
namespace {

constexpr uint64_t kMB = 1 << 20;

// Exit codes of the children below, each a step that failed.
enum : int {
  kSetUp = 10,
  kNotHeld = 11,    // the growth never reached its table made
  kLockHeld = 12,   // a request waited for the table being made
  kGrowth = 13,     // the growth failed, or added the wrong tables
  kRows = 14,       // a row is not in the index as put
  kDestroyed = 15,  // the destroy ended before the growth did
  kAdopted = 16,    // the restarted store's index is not the one left
  kSpilled = 17,    // a spilled row was refused, or the cache marked full
  kStillFull = 18,  // the cap's room came back, the cache took no rows
  kStuck = 19,      // after a growth that threw, the next or a destroy hung
  kAccount = 20,    // the memory account is not what the growth leaves
};

// The location of row `id` in these tests (no row is read).
uint64_t Loc(uint64_t id) { return layout::MakeLocation(1, 4096 + 64 * id); }

// How the store of a test is set up: its memory cap, the cache's size,
// and a spill dir (empty: none; else the cache is opened spilling).
struct StoreConfig {
  uint64_t cap = 256 * kMB;
  uint64_t size_mb = 64;
  std::string spill_dir;
};

// A store with one session and one 64 MB cache whose first index table
// holds rows 0 .. limit-1, as writers would have put them: the next insert
// finds it full and asks for a growth from 1 table.
class FullTableStore {
 public:
  FullTableStore(const std::string& run_dir, const std::string& shm_dir,
                 const StoreConfig& config = {})
      : paths_(MakeInstancePaths(40006, run_dir, shm_dir)), config_(config) {
    ok_ = log_.Open(run_dir + "/log", 1).ok();
    DaemonOptions o;
    o.memory_cap_bytes = config.cap;
    o.spill_dir = config.spill_dir;
    store_ = std::make_unique<Store>(o, paths_, /*num_nodes=*/1, 1, &log_);
  }
  // Creates the session and cache and fills the table (Adopt: adopts them
  // from the shm dir instead). False on a failed step.
  bool Start(bool adopt = false) {
    if (!ok_ || !store_->Init().ok()) return false;
    if (!adopt && !store_->CreateSession(&session_).ok()) return false;
    if (!store_
             ->OpenCache(session_, "c", "c-fp", config_.size_mb,
                         !config_.spill_dir.empty(), &cache_)
             .ok()) {
      return false;
    }
    if (!ShmFile::Open(paths_.CacheFile(cache_), &header_).ok()) return false;
    h_ = reinterpret_cast<layout::CacheHeader*>(header_.data());
    if (!ShmFile::Open(paths_.TableFile(cache_, 0, h_->tables[0].tag), &t0_).ok()) {
      return false;
    }
    IndexTable table0(reinterpret_cast<layout::TableHeader*>(t0_.data()));
    rows_ = table0.limit();
    for (uint64_t id = 0; !adopt && id < rows_; ++id) {
      if (table0.Insert(id, Loc(id)) != IndexTable::InsertResult::kInserted) return false;
    }
    return table0.Insert(rows_, Loc(rows_)) == IndexTable::InsertResult::kTableFull;
  }
  // Whether table `gen` is published and holds every row put.
  bool HoldsTheRows(uint32_t gen) {
    if (h_->num_tables.load() != gen + 1) return false;
    ShmFile t;
    if (!ShmFile::Open(paths_.TableFile(cache_, gen, h_->tables[gen].tag), &t).ok()) {
      return false;
    }
    IndexTable table(reinterpret_cast<layout::TableHeader*>(t.data()));
    for (uint64_t id = 0; id < rows_; ++id) {
      if (table.Find(id) != Loc(id)) return false;
    }
    return true;
  }
  // Puts rows rows() on in the newest table until it is full.
  bool FillNewest() {
    const uint32_t gen = h_->num_tables.load() - 1;
    ShmFile t;
    if (!ShmFile::Open(paths_.TableFile(cache_, gen, h_->tables[gen].tag), &t).ok()) {
      return false;
    }
    IndexTable table(reinterpret_cast<layout::TableHeader*>(t.data()));
    for (;;) {
      switch (table.Insert(rows_, Loc(rows_))) {
        case IndexTable::InsertResult::kInserted: ++rows_; break;
        case IndexTable::InsertResult::kTableFull: return true;
        case IndexTable::InsertResult::kExists: return false;
      }
    }
  }
  // Where table `gen` (published) has row `id`; kEmpty when it does not.
  uint64_t Find(uint32_t gen, uint64_t id) {
    ShmFile t;
    if (h_->num_tables.load() <= gen ||
        !ShmFile::Open(paths_.TableFile(cache_, gen, h_->tables[gen].tag), &t).ok()) {
      return layout::kEmpty;
    }
    return IndexTable(reinterpret_cast<layout::TableHeader*>(t.data())).Find(id);
  }
  // The size of table `gen`'s file (published); 0 when there is none.
  uint64_t TableSize(uint32_t gen) {
    ShmFile t;
    if (h_->num_tables.load() <= gen ||
        !ShmFile::Open(paths_.TableFile(cache_, gen, h_->tables[gen].tag), &t).ok()) {
      return 0;
    }
    return t.size();
  }
  // What the store counts against its cap.
  uint64_t MemoryUsed() {
    ServerInfo info;
    store_->FillServerInfo(&info);
    return info.memory_used_bytes;
  }
  // The cache's state bits (layout::kStateFull...).
  uint32_t state() const { return h_->state.load(); }
  // The rows put so far: 0 .. rows()-1.
  uint64_t rows() const { return rows_; }
  // The shm dir's index table files of the cache, generation `gen`.
  std::vector<std::string> TableFiles(uint32_t gen) const {
    const std::string path = paths_.TableFile(cache_, gen, 0);
    const std::string prefix =
        path.substr(path.rfind('/') + 1, path.size() - path.rfind('/') - 1 - 8);
    std::vector<std::string> out;
    for (const std::string& n : test::ListDir(paths_.shm_dir)) {
      if (n.rfind(prefix, 0) == 0) out.push_back(n);
    }
    return out;
  }

  Store& store() { return *store_; }
  uint32_t session() const { return session_; }
  uint32_t cache() const { return cache_; }
  // The ids of the session and cache to adopt.
  void Adopting(uint32_t session, uint32_t cache) {
    session_ = session;
    cache_ = cache;
  }

 private:
  InstancePaths paths_;
  StoreConfig config_;
  Logger log_;
  bool ok_ = false;
  std::unique_ptr<Store> store_;
  uint32_t session_ = 0, cache_ = 0;
  ShmFile header_, t0_;
  layout::CacheHeader* h_ = nullptr;
  uint64_t rows_ = 0;
};

// Holds a growth where its table is made (Store::TestHooks::table_made)
// until Open.
class Gate {
 public:
  void Hold() {
    std::unique_lock lock(mu_);
    reached_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  bool AwaitReached() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return reached_; });
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false;
  bool open_ = false;
};

// The shm dir and run dir of one test, removed at its end.
struct Dirs {
  std::string shm = test::MakeTempDir("/dev/shm", "shmcache-growth");
  std::string run = test::MakeTempDir(test::TestTmpRoot(), "growth");
  ~Dirs() {
    test::RemoveTree(shm);
    test::RemoveTree(run);
  }
};

// Runs `call` in a thread and waits for it; the child _exits with kStuck
// when it waits for good.
void Answered(const std::function<void()>& call) { test::ReturnsOrExit(call, kStuck); }

// Runs `body` in a forked child: its exit code, -9 when it hung (killed
// at its bound), -1 when the fork failed.
int InAChild(const std::function<int()>& body) {
  const pid_t child = test::ForkChild(body);
  return child > 0 ? test::WaitChild(child, 120) : -1;
}

// Runs `body` in a forked child, with a store whose cache's growth from
// one table is held where its table is made (the lock let go): `body`
// gets the store and the gate (Open lets the growth go on) and returns the
// child's exit code. The growth is then let go and waited for; it must
// have succeeded. Returns the child's exit code, -9 when it hung.
int WhileAGrowthIsHeld(const Dirs& dirs,
                       const std::function<int(FullTableStore&, Gate&)>& body,
                       const StoreConfig& config = {}) {
  return InAChild([&]() -> int {
    FullTableStore s(dirs.run, dirs.shm, config);
    Gate gate;
    s.store().SetTestHooks({.table_made = [&] { gate.Hold(); }});
    if (!s.Start()) return kSetUp;
    std::atomic<bool> grown{false};
    std::thread growth([&] { grown = s.store().GrowIndex(s.cache(), 1).ok(); });
    int code = gate.AwaitReached() ? body(s, gate) : kNotHeld;
    gate.Open();
    growth.join();
    if (code == 0 && !grown) code = kGrowth;
    if (code == 0) s.store().Shutdown();
    return code;
  });
}

// While a growth makes its table (its file's pages allocated, cleared and
// mapped: two thirds of its CPU past 1 Mi rows), requests that take the
// store's lock are answered, and a second writer that met the same full
// table waits for this growth instead of adding a table of its own. With
// the table made under the lock, CheckSession waited for the growth
// (kLockHeld).
TEST(StoreGrowthTest, RequestsGoOnWhileAGrowthMakesItsTable) {
  Dirs dirs;
  const int code = WhileAGrowthIsHeld(dirs, [](FullTableStore& s, Gate& gate) -> int {
    std::atomic<bool> second{false}, answered{false};
    std::thread other([&] { second = s.store().GrowIndex(s.cache(), 1).ok(); });
    std::thread check([&] {
      answered = s.store().CheckSession(s.session()).ok() &&
                 s.store().CheckSession(s.session() + 1).IsNotFound();
    });
    const bool in_time = test::WaitFor([&] { return answered.load(); });
    gate.Open();
    other.join();
    check.join();
    if (!in_time) return kLockHeld;
    if (!second) return kGrowth;
    return s.HoldsTheRows(1) ? 0 : kRows;
  });
  EXPECT_NE(code, -9) << "hung";
  EXPECT_EQ(code, 0);
}

// The thread state letter of thread `tid` of this process ('S': asleep).
char ThreadState(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

// A session destroyed while a growth of its cache makes the table waits
// for the growth (which uses the cache's mappings without the lock), then
// removes every file of the cache, the new table's too. Without the wait
// the destroy ended first (kDestroyed).
TEST(StoreGrowthTest, ADestroyWaitsForTheGrowthAndLeavesNoTable) {
  Dirs dirs;
  const int code = WhileAGrowthIsHeld(dirs, [](FullTableStore& s, Gate& gate) -> int {
    std::atomic<bool> destroyed{false};
    std::atomic<pid_t> tid{0};
    std::thread destroy([&] {
      tid = static_cast<pid_t>(syscall(SYS_gettid));
      destroyed = s.store().DestroySession(s.session()).ok();
    });
    // Asleep (waiting for the growth), or done: a destroy that did not
    // wait.
    const bool waited = test::WaitFor([&] {
      return destroyed.load() || (tid.load() != 0 && ThreadState(tid.load()) == 'S');
    });
    const bool early = destroyed.load();
    gate.Open();
    destroy.join();
    if (!waited || early) return kDestroyed;
    if (!destroyed) return kSetUp;
    return s.TableFiles(0).empty() && s.TableFiles(1).empty() ? 0 : kGrowth;
  });
  EXPECT_NE(code, -9) << "hung";
  EXPECT_EQ(code, 0);
}

// A row spilled while a growth of its cache makes the table, under a cap
// that has room for that one table: the spill path (which grows the index
// under the lock when the table is full) waits for the growth and puts the
// row in its table. Publishing at once, it reserved a second table of the
// same generation, found the cap used up, refused the row and marked the
// cache full (kSpilled), though the growth's table came a moment later.
TEST(StoreGrowthTest, ARowSpilledDuringAGrowthWaitsForItsTable) {
  Dirs dirs;
  StoreConfig config;
  config.spill_dir = dirs.run;
  // The cache's header and first table (2^12 slots: the budget, the cap,
  // is small), and room for one table of 2^13 slots, not two.
  const uint64_t table1 = layout::TableFileSize(uint64_t{1} << 13);
  config.cap = AlignUp(sizeof(layout::CacheHeader), 4096) +
               layout::TableFileSize(uint64_t{1} << 12) + table1 + table1 / 2;
  const int code = WhileAGrowthIsHeld(
      dirs,
      [](FullTableStore& s, Gate& gate) -> int {
        const uint64_t id = s.rows();  // not in the full table
        const std::string row = "spilled row";
        std::atomic<bool> done{false}, put{false}, inserted{false};
        std::atomic<pid_t> tid{0};
        std::thread spill([&] {
          tid = static_cast<pid_t>(syscall(SYS_gettid));
          bool added = false;
          put = s.store()
                    .SpillPut(s.cache(), id, std::as_bytes(std::span(row)), &added)
                    .ok();
          inserted = added;
          done = true;
        });
        // Done (refused at once), or asleep: waiting for the growth.
        (void)test::WaitFor([&] {
          return done.load() || (tid.load() != 0 && ThreadState(tid.load()) == 'S');
        });
        gate.Open();
        spill.join();
        if (!put || !inserted || (s.state() & layout::kStateFull) != 0) return kSpilled;
        if ((s.Find(1, id) & layout::kSpilledBit) == 0) return kSpilled;
        return s.HoldsTheRows(1) ? 0 : kRows;
      },
      config);
  EXPECT_NE(code, -9) << "hung";
  EXPECT_EQ(code, 0);
}

// A lease during a growth finds the cap's room taken by the older table
// and the new one both (the older one's bytes are released once its slots
// are freed, after the copy): under a cap that has a segment's room once
// the growth ended, but not before, it is refused and the cache marked
// full by the cap. Once the growth released those bytes the cache takes
// rows again, as it does when a destroy frees memory. Without that it
// stayed full (kStillFull), though under the lock, before the growth was
// made in steps, no request could see the room taken twice.
TEST(StoreGrowthTest, ACacheTheCapFilledDuringAGrowthTakesRowsAfterIt) {
  Dirs dirs;
  StoreConfig config;
  config.size_mb = 1;  // its first table: the least, 2^12 slots
  // Room for the header, the tables compacted away (a page each), the
  // newest (2^18 slots: 4 MB, what ResumeIfCapAllows asks for, once freed)
  // and the next (2^19), and under a segment's least more.
  config.cap = AlignUp(sizeof(layout::CacheHeader), 4096) + uint64_t{6} * 4096 +
               layout::TableFileSize(uint64_t{1} << 18) +
               layout::TableFileSize(uint64_t{1} << 19) + 8192;
  const int code = InAChild([&]() -> int {
    FullTableStore s(dirs.run, dirs.shm, config);
    Gate gate;
    std::atomic<bool> hold{false};
    s.store().SetTestHooks({.table_made = [&] {
      if (hold) gate.Hold();
    }});
    if (!s.Start()) return kSetUp;
    for (uint32_t n = 1; n < 7; ++n) {
      if (!s.store().GrowIndex(s.cache(), n).ok() || !s.FillNewest()) return kSetUp;
    }
    hold = true;
    std::atomic<bool> grown{false};
    std::thread growth([&] { grown = s.store().GrowIndex(s.cache(), 7).ok(); });
    if (!gate.AwaitReached()) {
      gate.Open();
      growth.join();
      return kNotHeld;
    }
    ChunkLease lease;
    const bool refused = s.store().LeaseChunk(1, s.cache(), 0, 100, &lease).IsFull();
    gate.Open();
    growth.join();
    if (!refused) return kSetUp;  // the cap left more room than planned
    if (!grown || !s.HoldsTheRows(7)) return kGrowth;
    if (!s.store().LeaseChunk(1, s.cache(), 0, 100, &lease).ok() ||
        (s.state() & layout::kStateFull) != 0) {
      return kStillFull;
    }
    s.store().Shutdown();
    return 0;
  });
  EXPECT_NE(code, -9) << "hung";
  EXPECT_EQ(code, 0);
}

// Where a test throws in a growth, as an allocation or std::random_device
// would: its step without the lock (Store::TestHooks::table_made), or one
// of its steps under the lock (Store::LockedStep: the set of running jobs,
// the index's vectors, the slots to free).
struct ThrowAt {
  std::string name;
  std::optional<Store::LockedStep> locked;  // none: the table made, unlocked
  bool before_added;                        // before FinishGrowth added the table
};

class GrowthThrowTest : public testing::TestWithParam<ThrowAt> {};

// A growth that throws at a step ends: the lock is let go (another
// request is answered), the cache's next growth, its destroy and the
// store's stop go on, the index holds every row, no table is left behind,
// and the memory account is what a growth that did not throw leaves.
// Thrown before its table was added the growth failed, its table removed
// and its bytes released; after, it is done. Thrown past the steps, the
// growth stayed under way for good, or (under the lock, locked and
// unlocked by hand) the lock stayed held: the next request waited for good
// (kStuck).
TEST_P(GrowthThrowTest, AGrowthThatThrowsEndsAndLeavesNoTable) {
  const ThrowAt at = GetParam();
  Dirs dirs;
  const int code = InAChild([&]() -> int {
    FullTableStore s(dirs.run, dirs.shm);
    std::atomic<bool> thrown{false};
    auto throw_once = [&] {
      if (!thrown.exchange(true)) throw std::bad_alloc();
    };
    s.store().SetTestHooks({.table_made =
                                [&] {
                                  if (!at.locked) throw_once();
                                },
                            .locked_step =
                                [&](Store::LockedStep step) {
                                  if (step == at.locked) throw_once();
                                }});
    if (!s.Start()) return kSetUp;
    const uint64_t used = s.MemoryUsed();
    bool first = false;
    Answered([&] {
      try {
        first = s.store().GrowIndex(s.cache(), 1).ok();
      } catch (const std::exception&) {  // let past GrowIndex
        first = false;
      }
    });
    bool answered = false, grown = false, destroyed = false;
    Answered([&] { answered = s.store().CheckSession(s.session()).ok(); });
    if (!thrown || !answered) return kSetUp;
    if (at.before_added) {
      if (first || !s.TableFiles(1).empty()) return kGrowth;
      if (s.MemoryUsed() != used) return kAccount;
    } else if (!first || !s.HoldsTheRows(1)) {
      return kGrowth;
    }
    // Grown now, or found grown by the thrown growth.
    Answered([&] { grown = s.store().GrowIndex(s.cache(), 1).ok(); });
    if (!grown) return kGrowth;
    if (!s.HoldsTheRows(1)) return kRows;
    if (s.TableFiles(1).size() != 1 || !s.TableFiles(2).empty()) return kGrowth;
    // The new table's bytes, and the first table's but for the page that
    // stays (its header) once its slots were freed.
    if (s.MemoryUsed() != used + s.TableSize(1) - (s.TableSize(0) - 4096))
      return kAccount;
    Answered([&] { destroyed = s.store().DestroySession(s.session()).ok(); });
    if (!destroyed) return kSetUp;
    s.store().Shutdown();
    return 0;
  });
  EXPECT_NE(code, -9) << "hung";
  EXPECT_EQ(code, 0);
}

INSTANTIATE_TEST_SUITE_P(
    EachStep, GrowthThrowTest,
    testing::Values(ThrowAt{"Begun", Store::LockedStep::kGrowthBegun, true},
                    ThrowAt{"TableMade", std::nullopt, true},
                    ThrowAt{"Finishing", Store::LockedStep::kGrowthFinishing, true},
                    ThrowAt{"Finished", Store::LockedStep::kGrowthFinished, false},
                    ThrowAt{"Ending", Store::LockedStep::kGrowthEnding, false}),
    [](const testing::TestParamInfo<ThrowAt>& info) { return info.param.name; });

// A daemon killed while a growth makes its table (the file there, not yet
// named by the cache's header) leaves an index the restarted one adopts
// as it was: one table holding every row, the unnamed file removed; its
// next growth copies every row into a new table.
TEST(StoreGrowthTest, ADaemonKilledWhileMakingATableLeavesAConsistentIndex) {
  Dirs dirs;
  struct Ids {
    std::atomic<uint32_t> session, cache;
  };
  auto* ids = test::SharedBlock<Ids>();
  const pid_t killed = test::ForkChild([&]() -> int {
    FullTableStore s(dirs.run, dirs.shm);
    s.store().SetTestHooks({.table_made = [] { raise(SIGKILL); }});
    if (!s.Start()) return kSetUp;
    ids->session = s.session();
    ids->cache = s.cache();
    (void)s.store().GrowIndex(s.cache(), 1);
    return kNotHeld;
  });
  ASSERT_GT(killed, 0);
  ASSERT_EQ(test::WaitChild(killed, 120), -SIGKILL);
  const pid_t restarted = test::ForkChild([&]() -> int {
    FullTableStore s(dirs.run, dirs.shm);
    s.Adopting(ids->session, ids->cache);
    if (s.TableFiles(1).size() != 1) return kSetUp;  // the table being made
    if (!s.Start(/*adopt=*/true)) return kAdopted;
    if (!s.TableFiles(1).empty() || !s.HoldsTheRows(0)) return kAdopted;
    if (!s.store().GrowIndex(s.cache(), 1).ok() || !s.HoldsTheRows(1)) return kGrowth;
    s.store().Shutdown();
    return 0;
  });
  ASSERT_GT(restarted, 0);
  const int code = test::WaitChild(restarted, 120);
  EXPECT_NE(code, -9) << "hung";
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace shmcache
