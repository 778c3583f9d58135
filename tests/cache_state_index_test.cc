// A cache's index tables (cache_state_index.cc): the next table is twice the
// last, and is added once however many clients that saw the last one ask.
#include "daemon/cache_state.h"

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

}  // namespace
}  // namespace shmcache
