#include "format/index_table.h"

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

using layout::kClaimed;
using layout::kEmpty;

// An index table in private zeroed memory, as the daemon formats one.
class TableMemory {
 public:
  explicit TableMemory(uint32_t log2, uint32_t gen = 0) {
    size_ = layout::TableFileSize(1ULL << log2);
    mem_ = static_cast<char*>(std::aligned_alloc(64, (size_ + 63) / 64 * 64));
    std::memset(mem_, 0, size_);
    IndexTable::Format(header(), size_, /*cache_id=*/1, gen, log2);
  }
  ~TableMemory() { std::free(mem_); }
  layout::TableHeader* header() { return reinterpret_cast<layout::TableHeader*>(mem_); }
  IndexTable table() { return IndexTable(header()); }
  size_t size() const { return size_; }

 private:
  char* mem_;
  size_t size_;
};

// Locations as the client makes them: segment 3, 8-aligned offsets.
uint64_t Loc(uint64_t key) {
  return layout::MakeLocation(3, 4096 + key * 8 % (1ULL << 39));
}

// Bound of every wait in these tests: a thread that never sees what it
// waits for fails the test instead of hanging it.
constexpr auto kWaitBound = std::chrono::seconds(20);

// Spins until cond() holds; false after kWaitBound.
template <typename Cond>
bool SpinUntil(Cond cond) {
  auto deadline = std::chrono::steady_clock::now() + kWaitBound;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
  }
  return true;
}

TEST(LocationTest, EncodingRoundTrips) {
  uint64_t loc = layout::MakeLocation(layout::kMaxSegmentId, layout::kOffsetMask);
  EXPECT_EQ(layout::LocationSegment(loc), layout::kMaxSegmentId);
  EXPECT_EQ(layout::LocationOffset(loc), layout::kOffsetMask);
  EXPECT_EQ(loc & layout::kSpilledBit, 0u);
  EXPECT_EQ(layout::LocationSegment(loc | layout::kSpilledBit), layout::kMaxSegmentId);
  EXPECT_NE(layout::MakeLocation(0, layout::kSegmentHeaderSize), kEmpty);
  EXPECT_NE(layout::MakeLocation(0, layout::kSegmentHeaderSize), kClaimed);
}

TEST(IndexTableTest, FormatWritesAValidHeader) {
  TableMemory m(12, 5);
  EXPECT_EQ(layout::CheckFileHeader(m.header(), m.size(), layout::kTableMagic,
                                    sizeof(layout::TableHeader)),
            nullptr);
  EXPECT_NE(layout::CheckFileHeader(m.header(), m.size() - 1, layout::kTableMagic,
                                    sizeof(layout::TableHeader)),
            nullptr);
  EXPECT_NE(layout::CheckFileHeader(m.header(), m.size(), layout::kSegmentMagic,
                                    sizeof(layout::TableHeader)),
            nullptr);
  EXPECT_EQ(m.header()->generation, 5u);
  IndexTable t = m.table();
  EXPECT_TRUE(t.valid());
  EXPECT_EQ(t.capacity(), 4096u);
  EXPECT_EQ(t.limit(), 3072u);
  EXPECT_EQ(t.claimed(), 0u);
  EXPECT_FALSE(IndexTable().valid());
}

TEST(IndexTableTest, InsertThenFind) {
  TableMemory m(10);
  IndexTable t = m.table();
  EXPECT_EQ(t.Find(5), kEmpty);
  EXPECT_EQ(t.Insert(5, Loc(5)), IndexTable::InsertResult::kInserted);
  EXPECT_EQ(t.Find(5), Loc(5));
  EXPECT_EQ(t.Find(6), kEmpty);
  EXPECT_EQ(t.claimed(), 1u);
}

TEST(IndexTableTest, DenseAndSparseKeys) {
  TableMemory m(14);
  IndexTable t = m.table();
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 5000; ++k) keys.push_back(k);  // dense sample ids
  std::mt19937_64 rng(1);
  for (int i = 0; i < 5000; ++i) keys.push_back(rng() | (1ULL << 63));  // any 64-bit id
  keys.push_back(~0ULL);
  for (uint64_t k : keys) {
    ASSERT_EQ(t.Insert(k, Loc(k)), IndexTable::InsertResult::kInserted) << k;
  }
  for (uint64_t k : keys) ASSERT_EQ(t.Find(k), Loc(k)) << k;
  for (uint64_t k = 5000; k < 6000; ++k) EXPECT_EQ(t.Find(k), kEmpty);
}

TEST(IndexTableTest, DuplicateKeepsTheFirstLocation) {
  TableMemory m(10);
  IndexTable t = m.table();
  ASSERT_EQ(t.Insert(9, Loc(9)), IndexTable::InsertResult::kInserted);
  EXPECT_EQ(t.Insert(9, Loc(100)), IndexTable::InsertResult::kExists);
  EXPECT_EQ(t.Find(9), Loc(9));
  EXPECT_EQ(t.claimed(), 1u);
}

TEST(IndexTableTest, FullAtThreeQuarters) {
  TableMemory m(8);  // 256 slots, limit 192
  IndexTable t = m.table();
  uint64_t k = 0;
  for (; k < t.limit(); ++k) {
    ASSERT_EQ(t.Insert(k, Loc(k)), IndexTable::InsertResult::kInserted) << k;
  }
  EXPECT_EQ(t.Insert(k, Loc(k)), IndexTable::InsertResult::kTableFull);
  EXPECT_EQ(t.claimed(), t.limit());
  // A full table still answers lookups, hits and misses.
  for (uint64_t j = 0; j < t.limit(); ++j) ASSERT_EQ(t.Find(j), Loc(j));
  EXPECT_EQ(t.Find(k), kEmpty);
  EXPECT_EQ(t.Find(1ULL << 50), kEmpty);
  // And still tells a duplicate from a new key.
  EXPECT_EQ(t.Insert(3, Loc(77)), IndexTable::InsertResult::kExists);
}

// CopyInto (the daemon's compaction of older tables into the newest):
// published rows are copied, a key the newer table holds keeps its
// location, claimed and retired slots are left behind, and a table too
// small says so.
TEST(IndexTableTest, CopyIntoCopiesPublishedRowsOnly) {
  TableMemory old_m(8);  // 256 slots
  IndexTable from = old_m.table();
  for (uint64_t k = 0; k < 150; ++k) {
    ASSERT_EQ(from.Insert(k, k % 3 == 0 ? layout::kSpilledBit : Loc(k)),
              IndexTable::InsertResult::kInserted);
  }
  EXPECT_EQ(from.RetireSpilled(), 50u);  // keys 0, 3, 6, ...
  layout::Slot* slots = layout::TableSlots(old_m.header());
  size_t claimed = 0;
  while (slots[claimed].loc.load() != kEmpty) ++claimed;
  slots[claimed].loc.store(kClaimed);  // a writer killed before it published
  TableMemory new_m(9);
  IndexTable to = new_m.table();
  ASSERT_EQ(to.Insert(1, Loc(1001)), IndexTable::InsertResult::kInserted);
  ASSERT_TRUE(from.CopyInto(&to));
  EXPECT_EQ(to.claimed(), 100u) << "the 100 rows not retired, once each";
  EXPECT_EQ(to.Find(1), Loc(1001)) << "the newer table's row stays";
  for (uint64_t k = 2; k < 150; ++k) {
    EXPECT_EQ(to.Find(k), k % 3 == 0 ? kEmpty : Loc(k)) << k;
  }
  TableMemory small_m(7);  // limit 96: the 100 rows do not fit
  IndexTable small = small_m.table();
  EXPECT_FALSE(from.CopyInto(&small));
}

TEST(IndexTableTest, ClaimedSlotOfADeadWriterIsSkipped) {
  TableMemory m(8);
  IndexTable t = m.table();
  ASSERT_EQ(t.Insert(1, Loc(1)), IndexTable::InsertResult::kInserted);
  // Find the slot of key 1 and claim its neighbour as a writer killed
  // between claim and publish would leave it.
  layout::Slot* slots = layout::TableSlots(m.header());
  size_t home = 0;
  for (size_t i = 0; i < 256; ++i) {
    if (slots[i].loc.load() == Loc(1)) home = i;
  }
  size_t next = (home + 1) % 256;
  ASSERT_EQ(slots[next].loc.load(), kEmpty);
  slots[next].loc.store(kClaimed);
  m.header()->claimed.fetch_add(1);
  // Keys probing through the dead slot still work; nothing waits on it.
  for (uint64_t k = 2; k < 150; ++k) {
    ASSERT_EQ(t.Insert(k, Loc(k)), IndexTable::InsertResult::kInserted);
  }
  for (uint64_t k = 1; k < 150; ++k) ASSERT_EQ(t.Find(k), Loc(k));
  EXPECT_EQ(t.Find(1000), kEmpty);
}

TEST(IndexTableTest, ConcurrentWritersOfDistinctKeys) {
  TableMemory m(16);
  IndexTable t = m.table();
  constexpr int kThreads = 4, kPer = 10000;
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      for (uint64_t i = 0; i < kPer; ++i) {
        uint64_t k = i * kThreads + w;
        ASSERT_EQ(t.Insert(k, Loc(k)), IndexTable::InsertResult::kInserted);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.claimed(), uint64_t{kThreads} * kPer);
  for (uint64_t k = 0; k < kThreads * kPer; ++k) ASSERT_EQ(t.Find(k), Loc(k));
}

TEST(IndexTableTest, RacingWritersOfOneKeyAgreeOnTheFirst) {
  // Many threads insert the same keys, each with its own location, and
  // look each key up right after their own insert. One writer of each key
  // is told it inserted, and every racer then sees that winner's location.
  // The one exception IndexTable admits: a writer stalled between claim
  // and publish past the bounded wait (preempted here, on a busy machine)
  // lets a second writer store the key too; such a key must have a writer
  // whose Insert took that long, and every racer still sees one of the
  // winners' locations.
  TableMemory m(14);
  IndexTable t = m.table();
  constexpr int kThreads = 4, kKeys = 2000;
  // AwaitPublished gives up after thousands of yields: far above this.
  constexpr auto kStall = std::chrono::microseconds(100);
  auto loc_of = [](int w, uint64_t k) {
    return layout::MakeLocation(static_cast<uint32_t>(w + 1), 4096 + k * 8);
  };
  std::vector<std::atomic<uint32_t>> winners(kKeys);  // bit w: w was told kInserted
  std::vector<std::atomic<bool>> stalled(kKeys);      // some Insert took >= kStall
  std::vector<std::vector<uint64_t>> seen(kThreads, std::vector<uint64_t>(kKeys));
  std::atomic<int> ready{0};
  std::atomic<bool> late{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      ready.fetch_add(1);
      if (!SpinUntil([&] { return ready.load() == kThreads; })) return late.store(true);
      for (uint64_t k = 0; k < kKeys; ++k) {
        auto t0 = std::chrono::steady_clock::now();
        if (t.Insert(k, loc_of(w, k)) == IndexTable::InsertResult::kInserted) {
          winners[k].fetch_or(1u << w);
        }
        if (std::chrono::steady_clock::now() - t0 >= kStall) stalled[k].store(true);
        seen[w][k] = t.Find(k);
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_FALSE(late.load()) << "the racers did not all start";
  int copies = 0;
  for (uint64_t k = 0; k < kKeys; ++k) {
    const uint32_t won = winners[k].load();
    ASSERT_NE(won, 0u) << "key " << k << ": nobody inserted it";
    auto a_winner = [&](uint64_t loc) {
      for (int w = 0; w < kThreads; ++w) {
        if ((won >> w & 1) && loc == loc_of(w, k)) return true;
      }
      return false;
    };
    if (std::popcount(won) > 1) {
      ++copies;
      EXPECT_TRUE(stalled[k].load())
          << "key " << k << ": a second copy, no writer stalled";
      EXPECT_TRUE(a_winner(t.Find(k))) << "key " << k;
      for (int w = 0; w < kThreads; ++w) EXPECT_TRUE(a_winner(seen[w][k])) << "key " << k;
      continue;
    }
    const uint64_t first = loc_of(std::countr_zero(won), k);
    EXPECT_EQ(t.Find(k), first) << "key " << k;
    for (int w = 0; w < kThreads; ++w) {
      EXPECT_EQ(seen[w][k], first) << "key " << k << ", writer " << w;
    }
  }
  if (copies > 0) std::printf("%d key(s) stored twice behind a stalled writer\n", copies);
}

// A writer that stalls between claiming a slot and publishing it, longer
// than the bounded wait, lets a second writer of the same id store it too
// (the case cache.h documents at Put). Each reader sees one whole row:
// the second copy until the stalled writer publishes, then the first.
TEST(IndexTableTest, AWriterStalledPastTheWaitLetsASecondCopyIn) {
  TableMemory m(8);
  IndexTable t = m.table();
  const uint64_t key = 42;
  layout::Slot* slots = layout::TableSlots(m.header());
  // Where key 42's probe starts: insert it into a scratch table first.
  TableMemory scratch(8);
  IndexTable probe = scratch.table();
  ASSERT_EQ(probe.Insert(key, Loc(key)), IndexTable::InsertResult::kInserted);
  size_t home = 0;
  for (size_t i = 0; i < 256; ++i) {
    if (layout::TableSlots(scratch.header())[i].loc.load() == Loc(key)) home = i;
  }
  // The stalled writer has claimed the home slot.
  slots[home].loc.store(kClaimed);
  m.header()->claimed.fetch_add(1);
  const uint64_t second = layout::MakeLocation(7, 8192);
  EXPECT_EQ(t.Insert(key, second), IndexTable::InsertResult::kInserted);
  EXPECT_EQ(t.Find(key), second);
  // It wakes up and publishes.
  slots[home].key.store(key);
  slots[home].loc.store(Loc(key));
  EXPECT_EQ(t.Find(key), Loc(key));
  EXPECT_EQ(t.Insert(key, Loc(1)), IndexTable::InsertResult::kExists);
}

TEST(IndexTableTest, RetiredSpilledRowsAreMissesAndTheirKeysCanBeInsertedAgain) {
  TableMemory m(8);
  IndexTable t = m.table();
  // Even keys in memory, odd keys spilled.
  auto spilled = [](uint64_t k) { return k % 2 == 1; };
  for (uint64_t k = 0; k < 120; ++k) {
    ASSERT_EQ(t.Insert(k, spilled(k) ? layout::kSpilledBit : Loc(k)),
              IndexTable::InsertResult::kInserted);
  }
  EXPECT_EQ(t.RetireSpilled(), 60u);
  EXPECT_EQ(t.RetireSpilled(), 0u);
  EXPECT_EQ(t.claimed(), 120u);  // retired slots stay taken
  for (uint64_t k = 0; k < 120; ++k) {
    EXPECT_EQ(t.Find(k), spilled(k) ? kEmpty : Loc(k)) << k;
  }
  // New keys probe past retired slots; retired keys are taken again, once.
  for (uint64_t k = 120; k < 160; ++k) {
    ASSERT_EQ(t.Insert(k, Loc(k)), IndexTable::InsertResult::kInserted);
  }
  for (uint64_t k = 1; k < 120; k += 2) {
    ASSERT_EQ(t.Insert(k, Loc(k)), IndexTable::InsertResult::kInserted) << k;
    EXPECT_EQ(t.Insert(k, Loc(k + 1)), IndexTable::InsertResult::kExists) << k;
  }
  EXPECT_EQ(t.claimed(), 160u);  // no slot was used twice for one key
  for (uint64_t k = 0; k < 160; ++k) EXPECT_EQ(t.Find(k), Loc(k)) << k;
}

TEST(IndexTableTest, RacingWritersTakeARetiredSlotOnceWhileReadersSeeMissOrRow) {
  TableMemory m(14);
  IndexTable t = m.table();
  constexpr int kWriters = 3, kKeys = 4000;
  for (uint64_t k = 0; k < kKeys; ++k) {
    ASSERT_EQ(t.Insert(k, layout::kSpilledBit), IndexTable::InsertResult::kInserted);
  }
  std::atomic<int> inserted[kKeys] = {};
  std::atomic<bool> go{false}, done{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    while (!done.load()) {
      for (uint64_t k = 0; k < kKeys; ++k) {
        uint64_t loc = t.Find(k);
        // A miss, the spilled row, or a writer's row of this key; never a
        // marker value or another key's row.
        if (loc != kEmpty && loc != layout::kSpilledBit &&
            layout::LocationOffset(loc) != 4096 + k * 8) {
          bad.fetch_add(1);
        }
      }
    }
  });
  std::thread retirer([&] {
    while (!go.load()) {
    }
    t.RetireSpilled();
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      while (!go.load()) {
      }
      for (uint64_t k = 0; k < kKeys; ++k) {
        uint64_t loc = layout::MakeLocation(static_cast<uint32_t>(w + 1), 4096 + k * 8);
        if (t.Insert(k, loc) == IndexTable::InsertResult::kInserted) {
          inserted[k].fetch_add(1);
        }
      }
    });
  }
  go.store(true);
  retirer.join();
  for (auto& th : writers) th.join();
  // A second pass after the retirer finished: every key is served again.
  for (uint64_t k = 0; k < kKeys; ++k) {
    if (t.Find(k) == kEmpty) {
      ASSERT_EQ(t.Insert(k, layout::MakeLocation(9, 4096 + k * 8)),
                IndexTable::InsertResult::kInserted);
      inserted[k].fetch_add(1);
    }
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(t.claimed(), uint64_t{kKeys});
  for (uint64_t k = 0; k < kKeys; ++k) {
    uint64_t loc = t.Find(k);
    // Every spilled row was retired, and exactly one writer took its slot
    // (a writer that came before the retirer found the row present).
    ASSERT_NE(loc, kEmpty) << k;
    ASSERT_NE(loc, layout::kSpilledBit) << k;
    EXPECT_EQ(inserted[k].load(), 1) << k;
    EXPECT_EQ(layout::LocationOffset(loc), 4096 + k * 8) << k;
  }
}

// The index grows as a chain of tables, newest first, the way CacheImpl
// looks rows up. Readers run while a writer fills table after table; every
// key the writer has published must be found, with its own location.
TEST(IndexTableTest, GrowthUnderConcurrentReaders) {
  constexpr uint32_t kMaxTables = 12;
  std::unique_ptr<TableMemory> mem[kMaxTables];
  IndexTable tables[kMaxTables];
  std::atomic<uint32_t> num_tables{0};
  std::atomic<uint64_t> published{0};  // keys [0, published) are in
  std::atomic<bool> done{false};
  auto add_table = [&](uint32_t log2) {
    uint32_t n = num_tables.load();
    mem[n] = std::make_unique<TableMemory>(log2, n);
    tables[n] = mem[n]->table();
    num_tables.store(n + 1, std::memory_order_release);
  };
  add_table(8);
  auto lookup = [&](uint64_t key) {
    uint32_t n = num_tables.load(std::memory_order_acquire);
    for (uint32_t i = n; i-- > 0;) {
      uint64_t loc = tables[i].Find(key);
      if (loc != kEmpty) return loc;
    }
    return kEmpty;
  };

  std::atomic<uint64_t> reads{0}, bad{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937_64 rng(r);
      while (!done.load(std::memory_order_acquire)) {
        uint64_t n = published.load(std::memory_order_acquire);
        if (n == 0) continue;
        uint64_t key = rng() % n;
        if (lookup(key) != Loc(key)) bad.fetch_add(1);
        // Keys not yet published are never found with a wrong location.
        uint64_t future = n + rng() % 64;
        uint64_t loc = lookup(future);
        if (loc != kEmpty && loc != Loc(future)) bad.fetch_add(1);
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }

  // The writer stops at its first failure; the readers are stopped and
  // joined before anything is asserted.
  constexpr uint64_t kKeys = 40000;
  std::string failure;
  for (uint64_t k = 0; k < kKeys && failure.empty(); ++k) {
    for (;;) {
      uint32_t n = num_tables.load();
      IndexTable::InsertResult r = tables[n - 1].Insert(k, Loc(k));
      if (r == IndexTable::InsertResult::kInserted) break;
      if (r == IndexTable::InsertResult::kExists || n == kMaxTables) {
        failure = "key " + std::to_string(k) +
                  (n == kMaxTables ? ": no room in the chain" : ": already there");
        break;
      }
      add_table(static_cast<uint32_t>(std::bit_width(tables[n - 1].capacity())));
    }
    published.store(k + 1, std::memory_order_release);
  }
  // Let the readers see the final state before stopping them.
  uint64_t seen = reads.load();
  bool read_on = SpinUntil([&] { return reads.load() >= seen + 1000; });
  done.store(true);
  for (auto& th : readers) th.join();
  ASSERT_EQ(failure, "");
  EXPECT_TRUE(read_on) << "the readers stopped reading";
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(num_tables.load(), 4u) << "the chain grew";
  for (uint64_t k = 0; k < kKeys; ++k) ASSERT_EQ(lookup(k), Loc(k));
}

}  // namespace
}  // namespace shmcache
