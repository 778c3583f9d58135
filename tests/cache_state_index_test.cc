// A cache's index tables (cache_state_index.cc): the next table is twice the
// last, and is added once however many clients that saw the last one ask.
#include "daemon/cache_state.h"

#include <sys/stat.h>

#include <cstring>

#include <gtest/gtest.h>

#include "format/index_table.h"
#include "tests/support/cache_state_fixture.h"

namespace shmcache {
namespace {

TEST_F(CacheStateTest, GrowIndexAddsADoubledTableOnce) {
  Create(64 * kMB);
  ShmFile header;
  ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header).ok());
  auto* h = reinterpret_cast<layout::CacheHeader*>(header.data());
  uint64_t cap0 = h->tables[0].capacity.load();
  uint64_t before = account_.used;
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  EXPECT_EQ(h->num_tables.load(), 2u);
  EXPECT_EQ(h->tables[1].capacity.load(), cap0 * 2);
  // The new table is counted, the old one's slots are not (compacted).
  EXPECT_EQ(account_.used - before,
            layout::TableFileSize(cap0 * 2) - (layout::TableFileSize(cap0) - 4096));
  // A second client that also saw one table does not grow it again.
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  EXPECT_EQ(h->num_tables.load(), 2u);
  ShmFile t1;
  ASSERT_TRUE(ShmFile::Open(paths_.TableFile(kCacheId, 1, h->tables[1].tag), &t1).ok());
  auto* th = reinterpret_cast<layout::TableHeader*>(t1.data());
  EXPECT_EQ(th->generation, 1u);
  EXPECT_EQ(th->capacity, cap0 * 2);
  EXPECT_EQ(IndexTable(th).Find(1), layout::kEmpty);
}

// Growing copies the rows of the older tables into the new one, then lets
// lookups probe that table alone and frees the older ones' slots; a
// restarted daemon adopts the index as it was left.
TEST_F(CacheStateTest, GrowIndexCompactsTheOlderTablesIntoTheNewOne) {
  Create(64 * kMB);
  ShmFile header;
  ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header).ok());
  auto* h = reinterpret_cast<layout::CacheHeader*>(header.data());
  ShmFile t0;
  ASSERT_TRUE(ShmFile::Open(paths_.TableFile(kCacheId, 0, h->tables[0].tag), &t0).ok());
  IndexTable table0(reinterpret_cast<layout::TableHeader*>(t0.data()));
  auto loc = [](uint64_t id) { return layout::MakeLocation(1, 4096 + 64 * id); };
  for (uint64_t id = 0; id < 1000; ++id)
    ASSERT_EQ(table0.Insert(id, loc(id)), IndexTable::InsertResult::kInserted);
  const uint64_t reserved = h->reserved_bytes.load();
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  EXPECT_EQ(h->first_table.load(), 1u);
  ShmFile t1;
  ASSERT_TRUE(ShmFile::Open(paths_.TableFile(kCacheId, 1, h->tables[1].tag), &t1).ok());
  IndexTable table1(reinterpret_cast<layout::TableHeader*>(t1.data()));
  for (uint64_t id = 0; id < 1000; ++id) {
    ASSERT_EQ(table1.Find(id), loc(id)) << id;
    ASSERT_EQ(table0.Find(id), layout::kEmpty) << id;
  }
  EXPECT_EQ(h->reserved_bytes.load(), reserved + t1.size() - (t0.size() - 4096));
  // A second growth copies from the newest only.
  ASSERT_TRUE(cache_->GrowIndex(2, &account_).ok());
  EXPECT_EQ(h->first_table.load(), 2u);
}

// A daemon killed during a compaction leaves first_table where it was (it
// is raised after the copy): the restarted daemon adopts every table, and
// its next growth copies them all into the new one.
TEST_F(CacheStateTest, AnIndexLeftMidCompactionIsAdoptedAndCompactedAtTheNextGrowth) {
  Create(64 * kMB);
  ShmFile header;
  ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header).ok());
  auto* h = reinterpret_cast<layout::CacheHeader*>(header.data());
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  ShmFile t0;
  ShmFile t1;
  ASSERT_TRUE(ShmFile::Open(paths_.TableFile(kCacheId, 0, h->tables[0].tag), &t0).ok());
  ASSERT_TRUE(ShmFile::Open(paths_.TableFile(kCacheId, 1, h->tables[1].tag), &t1).ok());
  IndexTable table0(reinterpret_cast<layout::TableHeader*>(t0.data()));
  IndexTable table1(reinterpret_cast<layout::TableHeader*>(t1.data()));
  // As the copy into table 1 leaves them when it stops halfway: rows 0..1999
  // in table 0, the first 1,000 of them copied, first_table still 0.
  h->first_table.store(0);
  auto loc = [](uint64_t id) { return layout::MakeLocation(1, 4096 + 64 * id); };
  for (uint64_t id = 0; id < 2000; ++id) {
    ASSERT_EQ(table0.Insert(id, loc(id)), IndexTable::InsertResult::kInserted);
    if (id < 1000) {
      ASSERT_EQ(table1.Insert(id, loc(id)), IndexTable::InsertResult::kInserted);
    }
  }
  MemoryAccount fresh;
  fresh.cap = 1024 * kMB;
  std::unique_ptr<CacheState> adopted;
  ASSERT_TRUE(CacheState::Adopt(paths_, kCacheId, {}, 1, &fresh, nullptr, &adopted).ok());
  ASSERT_TRUE(adopted->GrowIndex(2, &fresh).ok());
  EXPECT_EQ(h->first_table.load(), 2u);
  ShmFile t2;
  ASSERT_TRUE(ShmFile::Open(paths_.TableFile(kCacheId, 2, h->tables[2].tag), &t2).ok());
  IndexTable table2(reinterpret_cast<layout::TableHeader*>(t2.data()));
  for (uint64_t id = 0; id < 2000; ++id) ASSERT_EQ(table2.Find(id), loc(id)) << id;
  adopted.reset();
  // A first_table at or past the table count is refused on adoption.
  h->first_table.store(3);
  Status s = CacheState::Adopt(paths_, kCacheId, {}, 1, &fresh, nullptr, &adopted);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  h->first_table.store(2);
  // The adopting daemon's state owns table 2: it removes the files.
  ASSERT_TRUE(CacheState::Adopt(paths_, kCacheId, {}, 1, &fresh, nullptr, &adopted).ok());
  adopted->Destroy(&fresh);
  cache_->Destroy(&account_);
}

// Bytes the file of an index table holds in the shm dir.
uint64_t AllocatedBytes(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// A daemon killed after it raised first_table and before it freed the older
// tables' slots leaves their pages in the shm dir, which the adopting daemon
// counts as one page a table: it frees them, so that what it counts is what
// the tables hold.
TEST_F(CacheStateTest, AnAdoptedTableCompactedAwayHasItsSlotsFreed) {
  Create(64 * kMB);
  ShmFile header;
  ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header).ok());
  auto* h = reinterpret_cast<layout::CacheHeader*>(header.data());
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  ASSERT_EQ(h->first_table.load(), 1u);
  const std::string path0 = paths_.TableFile(kCacheId, 0, h->tables[0].tag);
  ShmFile t0;
  ASSERT_TRUE(ShmFile::Open(path0, &t0).ok());
  ASSERT_GT(t0.size(), 4096u);
  ASSERT_LE(AllocatedBytes(path0), 4096u) << "the compaction freed table 0's slots";
  // As the killed daemon left table 0: its slots still in memory, rows in them.
  std::memset(t0.data() + 4096, 0x5a, t0.size() - 4096);
  IndexTable table0(reinterpret_cast<layout::TableHeader*>(t0.data()));
  auto slot_locs = [&] {
    uint64_t live = 0;
    const auto* slots =
        layout::TableSlots(reinterpret_cast<layout::TableHeader*>(t0.data()));
    for (uint64_t i = 0; i < table0.capacity(); ++i) {
      live += slots[i].loc.load() > layout::kRetired;
    }
    return live;
  };
  ASSERT_GE(AllocatedBytes(path0), t0.size());
  MemoryAccount fresh;
  fresh.cap = 1024 * kMB;
  std::unique_ptr<CacheState> adopted;
  ASSERT_TRUE(CacheState::Adopt(paths_, kCacheId, {}, 1, &fresh, nullptr, &adopted).ok());
  EXPECT_LE(AllocatedBytes(path0), 4096u) << "the adopter freed table 0's slots";
  EXPECT_EQ(slot_locs(), 0u) << "no stale location is left in table 0";
  EXPECT_EQ(fresh.used, adopted->reserved_bytes());
  adopted.reset();
}

}  // namespace
}  // namespace shmcache
