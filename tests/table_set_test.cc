// TableSet: a client's view of a cache's index tables, over a real cache
// the daemon's CacheState made (no daemon process): tables mapped as the
// daemon adds them, rows found in whichever table holds them, and the hit
// path's lookup that maps nothing.
#include "lib/table_set.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "format/index_table.h"
#include "tests/support/cache_state_fixture.h"

namespace shmcache {
namespace {

class TableSetTest : public CacheStateTest {
 protected:
  void SetUp() override {
    CacheStateTest::SetUp();
    Create(64 * kMB);
    ASSERT_TRUE(ShmFile::Open(paths_.CacheFile(kCacheId), &header_file_).ok());
    header_ = reinterpret_cast<layout::CacheHeader*>(header_file_.data());
    tables_ = std::make_unique<TableSet>(header_, kCacheId, [this] { return paths_; });
    ASSERT_TRUE(tables_->MapNew().ok());
  }
  void TearDown() override {
    tables_.reset();
    CacheStateTest::TearDown();
  }
  // Table `gen` as another process would write into it.
  IndexTable Table(uint32_t gen) {
    ShmFile f;
    EXPECT_TRUE(
        ShmFile::Open(paths_.TableFile(kCacheId, gen, header_->tables[gen].tag), &f)
            .ok());
    maps_.push_back(std::move(f));
    return IndexTable(reinterpret_cast<layout::TableHeader*>(maps_.back().data()));
  }
  static uint64_t Loc(uint64_t id) { return layout::MakeLocation(1, 4096 + 64 * id); }

  ShmFile header_file_;
  layout::CacheHeader* header_ = nullptr;
  std::unique_ptr<TableSet> tables_;
};

TEST_F(TableSetTest, InsertNewestIsFoundByEveryLookup) {
  uint32_t tables = 0;
  ASSERT_EQ(tables_->InsertNewest(7, Loc(7), &tables),
            IndexTable::InsertResult::kInserted);
  EXPECT_EQ(tables, 1u);
  EXPECT_EQ(tables_->Lookup(7), Loc(7));
  EXPECT_EQ(tables_->LookupMapped(7), Loc(7));
  EXPECT_EQ(tables_->FindIn(7, tables_->CurrentRange()), Loc(7));
  EXPECT_EQ(tables_->Lookup(8), layout::kEmpty);
  EXPECT_EQ(tables_->InsertNewest(7, Loc(8), &tables), IndexTable::InsertResult::kExists);
  EXPECT_EQ(tables_->Lookup(7), Loc(7)) << "the first row of an id wins";
}

TEST_F(TableSetTest, ATableTheDaemonAddsIsMappedByLookupNotByTheHitPath) {
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  Table(1).Insert(42, Loc(42));  // another process, which mapped table 1
  EXPECT_EQ(tables_->LookupMapped(42), layout::kEmpty)
      << "the hit path looks in the tables mapped already";
  EXPECT_EQ(tables_->Lookup(42), Loc(42));
  EXPECT_EQ(tables_->Mapped(), 2u);
  EXPECT_EQ(tables_->LookupMapped(42), Loc(42));
}

TEST_F(TableSetTest, ARowOfAnOlderTableIsCopiedIntoTheNewestWhichAloneIsProbed) {
  uint32_t tables = 0;
  ASSERT_EQ(tables_->InsertNewest(3, Loc(3), &tables),
            IndexTable::InsertResult::kInserted);
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  ASSERT_TRUE(cache_->GrowIndex(2, &account_).ok());
  ASSERT_EQ(tables_->Mapped(), 3u);
  EXPECT_EQ(header_->first_table.load(), 2u);
  ASSERT_EQ(tables_->InsertNewest(4, Loc(4), &tables),
            IndexTable::InsertResult::kInserted);
  EXPECT_EQ(tables, 3u);
  EXPECT_EQ(Table(2).Find(4), Loc(4)) << "inserted into the newest table";
  EXPECT_EQ(Table(2).Find(3), Loc(3)) << "copied into the newest table";
  EXPECT_EQ(Table(0).Find(3), layout::kEmpty) << "the older tables' slots are freed";
  const TableSet::Range r = tables_->CurrentRange();
  EXPECT_EQ(r.first, 2u);
  EXPECT_EQ(r.end, 3u);
  for (uint64_t id : {3, 4}) {
    EXPECT_EQ(tables_->Lookup(id), Loc(id)) << id;
    EXPECT_EQ(tables_->LookupMapped(id), Loc(id)) << id;
    tables_->Prefetch(id, r);
    EXPECT_EQ(tables_->FindIn(id, r), Loc(id)) << id;
  }
  EXPECT_EQ(tables_->Lookup(5), layout::kEmpty);
}

// A lookup that read its range (CurrentRange) just before the daemon
// compacted the index, and probed after the older tables' slots were
// freed (its process descheduled between the two): the probe reads empty
// slots, and the row, published before the lookup began, is found in the
// newest table. The single Get's full path (Lookup) missed so: the
// ThreadSanitizer CI's index_growth_test, "reader: row 2062 of 6144
// missing".
TEST_F(TableSetTest, ALookupWhoseRangeACompactionFreedFindsTheRowInTheNewest) {
  uint32_t tables = 0;
  ASSERT_EQ(tables_->InsertNewest(3, Loc(3), &tables),
            IndexTable::InsertResult::kInserted);
  const TableSet::Range stale = tables_->CurrentRange();
  ASSERT_EQ(stale.end, 1u);
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());  // copy, first_table 1, free 0
  ASSERT_TRUE(cache_->GrowIndex(2, &account_).ok());  // and again: 2, free 0 and 1
  ASSERT_EQ(tables_->FindIn(3, stale), layout::kEmpty) << "the range's table was freed";
  EXPECT_EQ(tables_->LookupFrom(3, stale), Loc(3));
  EXPECT_EQ(tables_->Mapped(), 3u) << "the newest table mapped on the way";
  EXPECT_EQ(tables_->LookupFrom(4, stale), layout::kEmpty) << "never published";
  EXPECT_EQ(tables_->LookupMapped(3), Loc(3)) << "the hit path's range refreshed";
}

// Tables not compacted (a copy that found the newest table full): a row in
// an older table is found behind the newer ones.
TEST_F(TableSetTest, WithoutACompactionEveryTableFromTheFirstIsProbed) {
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  ASSERT_EQ(tables_->Mapped(), 2u);
  header_->first_table.store(0);  // as if the copy had stopped
  ASSERT_EQ(Table(0).Insert(3, Loc(3)), IndexTable::InsertResult::kInserted);
  ASSERT_EQ(Table(1).Insert(4, Loc(4)), IndexTable::InsertResult::kInserted);
  const TableSet::Range r = tables_->CurrentRange();
  EXPECT_EQ(r.first, 0u);
  for (uint64_t id : {3, 4}) {
    EXPECT_EQ(tables_->Lookup(id), Loc(id)) << id;
    EXPECT_EQ(tables_->LookupMapped(id), Loc(id)) << id;
    EXPECT_EQ(tables_->FindIn(id, r), Loc(id)) << id;
  }
  EXPECT_EQ(tables_->FindIn(3, {1, 2}), layout::kEmpty) << "the range's tables only";
}

// A process whose tables are stale when the daemon compacts the index: its
// hit path misses (the full path maps the newest table and finds rows), and
// a row it publishes in the older table after the copy is published in the
// newest too, where lookups find it.
TEST_F(TableSetTest, ARowPublishedInACompactedTableIsPublishedInTheNewestToo) {
  uint32_t tables = 0;
  ASSERT_EQ(tables_->InsertNewest(1, Loc(1), &tables),
            IndexTable::InsertResult::kInserted);
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());  // this set still maps one
  EXPECT_EQ(tables_->LookupMapped(1), layout::kEmpty)
      << "the hit path does not probe a table compacted away";
  ASSERT_EQ(tables_->Publish(2, Loc(2), &tables), TableSet::Published::kInserted);
  EXPECT_EQ(tables, 2u) << "followed into the newest table";
  EXPECT_EQ(Table(0).Find(2), Loc(2)) << "published in the stale table first";
  TableSet fresh(header_, kCacheId, [this] { return paths_; });
  ASSERT_TRUE(fresh.MapNew().ok());
  EXPECT_EQ(fresh.LookupMapped(2), Loc(2));
  EXPECT_EQ(fresh.Lookup(1), Loc(1));
  EXPECT_EQ(tables_->Lookup(2), Loc(2));
  // Published in the newest at once: nothing more to do.
  ASSERT_EQ(tables_->Publish(5, Loc(5), &tables), TableSet::Published::kInserted);
  EXPECT_EQ(tables, 2u);
  EXPECT_EQ(fresh.LookupMapped(5), Loc(5));
}

// The same, but the newest table filled before the row reached it: the
// copy passed the row's slot, so the row is published where no lookup
// probes. Publish says so (kBehind, with the tables it saw), and once the
// index grew, Republish publishes it in the new table.
TEST_F(TableSetTest, ARowThatCannotFollowIntoAFullNewestTableIsReportedBehind) {
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());  // this set still maps one
  IndexTable t1 = Table(1);
  uint64_t filler = 1000;
  while (t1.Insert(filler, Loc(filler)) != IndexTable::InsertResult::kTableFull) ++filler;
  uint32_t tables = 0;
  ASSERT_EQ(tables_->Publish(2, Loc(2), &tables), TableSet::Published::kBehind);
  EXPECT_EQ(tables, 2u) << "the full table's count: the index grows past it";
  EXPECT_EQ(tables_->Lookup(2), layout::kEmpty) << "lookups probe table 1 alone";
  ASSERT_TRUE(cache_->GrowIndex(tables, &account_).ok());
  ASSERT_TRUE(tables_->MapNew().ok());
  ASSERT_EQ(tables_->Republish(2, Loc(2), &tables), TableSet::Published::kInserted);
  EXPECT_EQ(tables, 3u);
  TableSet fresh(header_, kCacheId, [this] { return paths_; });
  ASSERT_TRUE(fresh.MapNew().ok());
  EXPECT_EQ(fresh.LookupMapped(2), Loc(2));
  EXPECT_EQ(fresh.Lookup(1000), Loc(1000));
  // Republished where the newest table holds the id already (the copy, or
  // another writer of the id, put it there): it is found, nothing more to
  // do.
  uint32_t seen = 2;
  EXPECT_EQ(tables_->Republish(2, Loc(9), &seen), TableSet::Published::kInserted);
  EXPECT_EQ(fresh.Lookup(2), Loc(2));
}

// A newer table this process cannot map: the row cannot follow either.
TEST_F(TableSetTest, ARowThatCannotFollowIntoAnUnmappableTableIsReportedBehind) {
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());  // this set still maps one
  const uint64_t cap = header_->tables[1].capacity.load();
  header_->tables[1].capacity.store(cap * 2);  // not the file's
  uint32_t tables = 0;
  ASSERT_EQ(tables_->Publish(2, Loc(2), &tables), TableSet::Published::kBehind);
  EXPECT_EQ(tables, 1u);
  EXPECT_TRUE(tables_->MapNew().IsCorruption());
  EXPECT_EQ(tables_->Republish(2, Loc(2), &tables), TableSet::Published::kBehind);
  header_->tables[1].capacity.store(cap);
  ASSERT_TRUE(tables_->MapNew().ok());
  ASSERT_EQ(tables_->Republish(2, Loc(2), &tables), TableSet::Published::kInserted);
  EXPECT_EQ(tables, 2u);
  EXPECT_EQ(tables_->Lookup(2), Loc(2));
}

// A batch that took its range before a compaction probes the compacted
// table after its slots were freed: each probe misses, but on tmpfs a read
// of a freed page allocates it again, bytes the daemon counts no more. The
// next growth frees them again.
TEST_F(TableSetTest, PagesAStaleReaderBroughtBackAreFreedAtTheNextGrowth) {
  const TableSet::Range stale = tables_->CurrentRange();
  ASSERT_EQ(stale.end, 1u);
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  const std::string path0 = paths_.TableFile(kCacheId, 0, header_->tables[0].tag);
  auto allocated = [&] {
    struct stat st {};
    EXPECT_EQ(stat(path0.c_str(), &st), 0) << path0;
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  ASSERT_LE(allocated(), 4096u) << "the compaction freed table 0's slots";
  for (uint64_t id = 0; id < 10000; ++id) {
    ASSERT_EQ(tables_->FindIn(id, stale), layout::kEmpty) << id;
  }
  ASSERT_GT(allocated(), 4096u) << "the stale probes brought pages back";
  ASSERT_TRUE(cache_->GrowIndex(2, &account_).ok());
  EXPECT_LE(allocated(), 4096u) << "the next growth freed them again";
}

TEST_F(TableSetTest, AFullTableAsksForGrowthPastTheTablesSeen) {
  IndexTable t0 = Table(0);
  uint32_t tables = 0;
  uint64_t id = 0;
  IndexTable::InsertResult r = IndexTable::InsertResult::kInserted;
  for (; id <= t0.limit() && r == IndexTable::InsertResult::kInserted; ++id) {
    r = tables_->InsertNewest(id, Loc(id), &tables);
  }
  ASSERT_EQ(r, IndexTable::InsertResult::kTableFull);
  EXPECT_EQ(tables, 1u);
  ASSERT_TRUE(cache_->GrowIndex(tables, &account_).ok());
  ASSERT_TRUE(tables_->MapNew().ok());
  EXPECT_EQ(tables_->InsertNewest(id, Loc(id), &tables),
            IndexTable::InsertResult::kInserted);
  EXPECT_EQ(tables, 2u);
  EXPECT_EQ(tables_->Lookup(0), Loc(0));
  EXPECT_EQ(tables_->Lookup(id), Loc(id));
}

TEST_F(TableSetTest, ATableThatDoesNotMatchItsHeaderEntryIsRefusedAndTheOthersStay) {
  uint32_t tables = 0;
  ASSERT_EQ(tables_->InsertNewest(1, Loc(1), &tables),
            IndexTable::InsertResult::kInserted);
  ASSERT_TRUE(cache_->GrowIndex(1, &account_).ok());
  const uint64_t cap = header_->tables[1].capacity.load();
  header_->tables[1].capacity.store(cap * 2);  // not the file's
  Status s = tables_->MapNew();
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_EQ(tables_->Mapped(), 1u);
  // Table 0 was compacted into table 1, which cannot be mapped: a miss (the
  // trainer reads the source), never a wrong row.
  EXPECT_EQ(tables_->Lookup(1), layout::kEmpty);
  header_->tables[1].capacity.store(cap);
  EXPECT_TRUE(tables_->MapNew().ok());
  EXPECT_EQ(tables_->Mapped(), 2u);
  EXPECT_EQ(tables_->Lookup(1), Loc(1));
}

}  // namespace
}  // namespace shmcache
