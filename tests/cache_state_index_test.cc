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
  EXPECT_EQ(account_.used - before, layout::TableFileSize(cap0 * 2));
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

}  // namespace
}  // namespace shmcache
