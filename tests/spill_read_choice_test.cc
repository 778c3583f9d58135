// A cache's spilled rows are read the way the cache's own spilled rows'
// mean size chooses (CacheImpl::SpilledRowBytes, lib/spill_reader.h): rows
// averaging SpillReader::kSeekRowBytes or more in place, by seeks, smaller
// ones copied out of MultiGet. Through GetBatch and Get, from the first
// read of a cache opened before any row spilled, for each cache of an
// instance whatever another cache read before, and again once rows
// spilled since the last read moved the mean past the bound. Which way a
// row took shows nowhere else (both end as a copy in the caller's row):
// SpillReader::RowsReadInPlace counts the rows handed over in place, and
// the cache's spill_reads the rows its reader read at all.
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "lib/spill_reader.h"
#include "shmcache/client.h"
#include "tests/support/row_pattern.h"
#include "tests/support/test_server.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {
namespace {

constexpr uint64_t kSalt = 11;
constexpr size_t kSmall = size_t{3} << 10;
constexpr size_t kLarge = size_t{256} << 10;
static_assert(kSmall < SpillReader::kSeekRowBytes && kLarge > SpillReader::kSeekRowBytes);

class SpillReadChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spill_ = MakeTempDir(TestTmpRoot(), "spill");
    server_ = std::make_unique<TestServer>(WithArgs({"-s", spill_}));
    ASSERT_TRUE(server_->ok()) << server_->start_result().Describe();
    ASSERT_TRUE(server_->Connect(&client_).ok());
    session_ = server_->NewSession();
  }
  void TearDown() override {
    client_.reset();
    if (server_) {
      EXPECT_EQ(server_->Stop().exit_code, 0);
    }
    server_.reset();
    RemoveTree(spill_);
  }
  // A cache of 1 MB of memory, the rest of its rows on disk.
  std::unique_ptr<Cache> Open(const char* name) {
    std::unique_ptr<Cache> cache;
    EXPECT_TRUE(client_->OpenCache(CacheNamed(session_, name, 1, true), &cache).ok());
    return cache;
  }
  // Rows of `bytes` from id `first` on until `spilled` more than before are
  // on disk; their ids.
  static std::vector<uint64_t> SpillRows(Cache* cache, uint64_t first, size_t bytes,
                                         uint64_t spilled) {
    CacheStats st;
    EXPECT_TRUE(cache->GetStats(&st).ok());
    const uint64_t want = st.disk_rows + spilled;
    std::vector<uint64_t> ids;
    for (uint64_t id = first; st.disk_rows < want; ++id) {
      const std::vector<uint8_t> row = Pattern(id, kSalt, bytes);
      const Status s = cache->Put(id, row.data(), row.size());
      EXPECT_TRUE(s.ok()) << "row " << id << ": " << s.ToString();
      if (!s.ok()) return {};
      const uint64_t on_disk = st.disk_rows;
      EXPECT_TRUE(cache->GetStats(&st).ok());
      if (st.disk_rows > on_disk) ids.push_back(id);
    }
    return ids;
  }

  struct Reads {
    uint64_t in_place = 0;  // rows the process's readers handed over in place
    uint64_t from_db = 0;   // rows the cache's reader read (spill_reads)
  };
  // GetBatch of `ids` (Get of each when !batch), each of `bytes` and
  // checked whole; how they were read.
  static Reads Read(Cache* cache, const std::vector<uint64_t>& ids, size_t bytes,
                    bool batch = true) {
    CacheStats before;
    EXPECT_TRUE(cache->GetStats(&before).ok());
    const uint64_t in_place = SpillReader::RowsReadInPlace();
    std::vector<Row> rows(ids.size());
    std::vector<Status> statuses(ids.size());
    if (batch) {
      EXPECT_TRUE(cache->GetBatch(ids, rows, statuses).ok());
    } else {
      for (size_t k = 0; k < ids.size(); ++k) statuses[k] = cache->Get(ids[k], &rows[k]);
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      EXPECT_TRUE(statuses[k].ok()) << "row " << ids[k] << ": " << statuses[k].ToString();
      const std::vector<uint8_t> want = Pattern(ids[k], kSalt, bytes);
      std::optional<ColumnView> c = rows[k].view().find("data");
      EXPECT_TRUE(c && c->nbytes == want.size() &&
                  std::memcmp(c->data, want.data(), want.size()) == 0)
          << "row " << ids[k] << " not read back whole";
    }
    CacheStats after;
    EXPECT_TRUE(cache->GetStats(&after).ok());
    return Reads{SpillReader::RowsReadInPlace() - in_place,
                 after.spill_reads - before.spill_reads};
  }
  // Read until the cache's reader read every row itself (a row spilled
  // after the reader's last catch-up goes to the daemon until the reader
  // catches up, at most every 50 ms); how that read went.
  static Reads ReadFromTheDatabase(Cache* cache, const std::vector<uint64_t>& ids,
                                   size_t bytes, bool batch = true) {
    Reads r;
    EXPECT_TRUE(WaitFor([&] {
      r = Read(cache, ids, bytes, batch);
      return r.from_db == ids.size() || ::testing::Test::HasFailure();
    })) << r.from_db
        << " of " << ids.size() << " rows read from the database";
    return r;
  }

  std::string spill_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
  uint32_t session_ = 0;
};

TEST_F(SpillReadChoiceTest, ACachesLargeRowsAreReadInPlaceFromItsFirstRead) {
  // Opened before any of its rows spilled: their mean was 0 then.
  std::unique_ptr<Cache> cache = Open("large");
  ASSERT_TRUE(cache);
  const std::vector<uint64_t> ids = SpillRows(cache.get(), 0, kLarge, 12);
  ASSERT_EQ(ids.size(), 12u);
  Reads r = ReadFromTheDatabase(cache.get(), ids, kLarge);
  EXPECT_EQ(r.in_place, ids.size()) << "large rows copied out of MultiGet by GetBatch";
  r = ReadFromTheDatabase(cache.get(), ids, kLarge, /*batch=*/false);
  EXPECT_EQ(r.in_place, ids.size()) << "large rows copied out of MultiGet by Get";
}

TEST_F(SpillReadChoiceTest, EachCacheIsReadTheWayItsOwnRowsChoose) {
  // Two caches of one instance (one reader in this process), read in
  // turns: neither takes the other's way.
  std::unique_ptr<Cache> large = Open("large");
  std::unique_ptr<Cache> small = Open("small");
  ASSERT_TRUE(large && small);
  const std::vector<uint64_t> large_ids = SpillRows(large.get(), 0, kLarge, 12);
  const std::vector<uint64_t> small_ids = SpillRows(small.get(), 0, kSmall, 64);
  ASSERT_EQ(large_ids.size(), 12u);
  ASSERT_EQ(small_ids.size(), 64u);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    Reads r = ReadFromTheDatabase(large.get(), large_ids, kLarge);
    EXPECT_EQ(r.in_place, large_ids.size()) << "large rows copied out of MultiGet";
    r = ReadFromTheDatabase(small.get(), small_ids, kSmall);
    EXPECT_EQ(r.in_place, 0u) << "small rows read by seeks";
  }
}

TEST_F(SpillReadChoiceTest, RowsAreReadInPlaceOnceTheRowsSpilledSinceMoveTheMeanPast) {
  // 3 KB rows spilled and read (copied out of MultiGet), then large rows
  // spilled until the mean of the cache's spilled rows is past the bound:
  // every row, the 3 KB ones too, is then read in place.
  std::unique_ptr<Cache> cache = Open("growing");
  ASSERT_TRUE(cache);
  std::vector<uint64_t> small_ids = SpillRows(cache.get(), 0, kSmall, 32);
  ASSERT_EQ(small_ids.size(), 32u);
  Reads r = ReadFromTheDatabase(cache.get(), small_ids, kSmall);
  EXPECT_EQ(r.in_place, 0u) << "small rows read by seeks";

  const uint64_t next = small_ids.back() + 1;
  const std::vector<uint64_t> large_ids = SpillRows(cache.get(), next, kLarge, 12);
  ASSERT_EQ(large_ids.size(), 12u);
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  ASSERT_GE(st.disk_bytes / st.disk_rows, SpillReader::kSeekRowBytes)
      << "the large rows did not move the mean past the bound";
  r = ReadFromTheDatabase(cache.get(), large_ids, kLarge);
  EXPECT_EQ(r.in_place, large_ids.size()) << "large rows copied out of MultiGet";
  r = ReadFromTheDatabase(cache.get(), small_ids, kSmall);
  EXPECT_EQ(r.in_place, small_ids.size()) << "the cache's rows were not read in place";
}

}  // namespace
}  // namespace shmcache::test
