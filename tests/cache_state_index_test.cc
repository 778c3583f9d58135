// A cache's index tables (cache_state_index.cc): the next table is twice the
// last, and is added once however many clients that saw the last one ask.
#include "daemon/cache_state.h"

#include <sys/stat.h>

#include <cstring>
#include <optional>
#include <string>

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

// A cache of 64 MB, rows in its first table, and the table jobs a
// preparer would run for it.
class TableAheadTest : public CacheStateTest {
 protected:
  void Start() {
    Create(64 * kMB);
    ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header_).ok());
    h_ = reinterpret_cast<layout::CacheHeader*>(header_.data());
    ASSERT_TRUE(
        ShmFile::Open(paths_.TableFile(kCacheId, 0, h_->tables[0].tag), &t0_).ok());
    table0_ = IndexTable(reinterpret_cast<layout::TableHeader*>(t0_.data()));
  }
  // Rows 0 .. n-1.
  void Fill(uint64_t n) {
    for (uint64_t id = 0; id < n; ++id) ASSERT_NO_FATAL_FAILURE(Put(id));
  }
  void Put(uint64_t id) {
    ASSERT_EQ(table0_.Insert(id, Loc(id)), IndexTable::InsertResult::kInserted);
  }
  static uint64_t Loc(uint64_t id) { return layout::MakeLocation(1, 4096 + 64 * id); }
  // Runs `job` as the preparer does and hands it back; *tag: its file's.
  void RunJob(const SegmentJob& job, uint32_t* tag) {
    ShmFile made;
    std::string skipped;
    ASSERT_TRUE(CacheState::RunTableJob(paths_, job, &made, tag, &skipped).ok());
    cache_->FinishTableJob(job, Status::OK(), std::move(made), *tag, &account_);
  }
  bool Exists(uint32_t gen, uint32_t tag) const {
    struct stat st;
    return stat(paths_.TableFile(kCacheId, gen, tag).c_str(), &st) == 0;
  }

  ShmFile header_;
  layout::CacheHeader* h_ = nullptr;
  ShmFile t0_;
  IndexTable table0_;
};

// The next table made ahead (TakeTableJob, run off the lock) is counted
// from the job's start and is the one the growth publishes: the growth
// reserves nothing more.
TEST_F(TableAheadTest, ATableMadeAheadIsTheOneTheGrowthPublishes) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint64_t cap0 = table0_.capacity();
  ASSERT_NO_FATAL_FAILURE(Fill(cap0 / 2 - 1));
  EXPECT_FALSE(cache_->TakeTableJob(&account_).has_value()) << "below half: none yet";
  ASSERT_NO_FATAL_FAILURE(Put(cap0));
  const uint64_t used = account_.used;
  const uint64_t reserved = h_->reserved_bytes.load();
  std::optional<SegmentJob> job = cache_->TakeTableJob(&account_);
  ASSERT_TRUE(job.has_value());
  EXPECT_FALSE(cache_->TakeTableJob(&account_).has_value()) << "one at a time";
  const uint64_t bytes = layout::TableFileSize(cap0 * 2);
  EXPECT_EQ(account_.used, used + bytes);
  EXPECT_EQ(h_->reserved_bytes.load(), reserved + bytes);
  EXPECT_TRUE(cache_->MakingTableAhead(1));
  uint32_t tag = 0;
  ASSERT_NO_FATAL_FAILURE(RunJob(*job, &tag));
  EXPECT_FALSE(cache_->MakingTableAhead(1));
  EXPECT_EQ(h_->num_tables.load(), 1u) << "made, not published";

  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  EXPECT_EQ(h_->num_tables.load(), 2u);
  EXPECT_EQ(h_->tables[1].tag, tag);
  EXPECT_EQ(h_->tables[1].capacity.load(), cap0 * 2);
  // Only the older table's slots were released.
  EXPECT_EQ(account_.used, used + bytes - (t0_.size() - 4096));
  EXPECT_EQ(h_->reserved_bytes.load(), reserved + bytes - (t0_.size() - 4096));
  ShmFile t1;
  ASSERT_TRUE(ShmFile::Open(paths_.TableFile(kCacheId, 1, tag), &t1).ok());
  IndexTable table1(reinterpret_cast<layout::TableHeader*>(t1.data()));
  EXPECT_EQ(table1.Find(cap0), Loc(cap0));
  EXPECT_EQ(table1.Find(0), Loc(0));
}

// A growth that does not wait for the table being made (Store::GrowIndex
// waits unless the daemon is stopping) makes its own under the lock and
// releases the job's bytes; the late table is removed.
TEST_F(TableAheadTest, ATableMadeAheadTooLateIsRemovedAndNotCounted) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Fill(table0_.capacity() / 2));
  const uint64_t used = account_.used;
  std::optional<SegmentJob> job = cache_->TakeTableJob(&account_);
  ASSERT_TRUE(job.has_value());
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  const uint64_t grown =
      used + layout::TableFileSize(table0_.capacity() * 2) - (t0_.size() - 4096);
  EXPECT_EQ(account_.used, grown);
  uint32_t tag = 0;
  ASSERT_NO_FATAL_FAILURE(RunJob(*job, &tag));
  ASSERT_NE(tag, h_->tables[1].tag);
  EXPECT_FALSE(Exists(1, tag)) << "removed";
  EXPECT_EQ(account_.used, grown);
}

// Destroy removes a table made ahead with the cache's other files, and
// releases its bytes (TearDown checks the shm dir is empty too).
TEST_F(TableAheadTest, DestroyRemovesATableMadeAhead) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(Fill(table0_.capacity() / 2));
  std::optional<SegmentJob> job = cache_->TakeTableJob(&account_);
  ASSERT_TRUE(job.has_value());
  uint32_t tag = 0;
  ASSERT_NO_FATAL_FAILURE(RunJob(*job, &tag));
  ASSERT_TRUE(Exists(1, tag));
  cache_->Destroy(&account_);
  EXPECT_FALSE(Exists(1, tag)) << "removed";
  EXPECT_EQ(account_.used, 0u);
}

}  // namespace
}  // namespace shmcache
