// The calls of one Cache in one process (cache.h, row.h): put, get, view,
// contains, column projection, and what each leaves in its outputs after
// an error. A real daemon per test (integration_fixture.h).
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "format/cache_share.h"
#include "format/row_copy.h"
#include "shmcache/batch_reader.h"
#include "tests/support/integration_fixture.h"
#include "tests/support/row_pattern.h"

namespace shmcache::test {
namespace {

TEST_F(IntegrationTest, PutGetViewContainsInOneProcess) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  Row row;
  EXPECT_TRUE(cache->Get(1, &row).IsNotFound());
  EXPECT_FALSE(cache->Contains(1));
  bool inserted = false;
  ASSERT_TRUE(PutPattern(*cache, 1, 0, kRowBytes, &inserted).ok());
  EXPECT_TRUE(inserted);
  EXPECT_TRUE(cache->Contains(1));
  ASSERT_TRUE(cache->Get(1, &row).ok());
  EXPECT_TRUE(RowMatches(row, 1, 0, kRowBytes));
  RowView view;
  ASSERT_TRUE(cache->View(1, &view).ok());
  ASSERT_EQ(view.num_columns(), 1u);
  EXPECT_EQ(std::memcmp(view.column(0).data, Pattern(1, 0, kRowBytes).data(), kRowBytes),
            0);
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, 1u);
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_GE(st.avg_row_bytes(), kRowBytes);
  EXPECT_LE(st.avg_row_bytes(), kRowBytes + 64) << "per-row overhead";
  EXPECT_EQ(st.session_id, session_);
  EXPECT_EQ(st.name, "train");
}

// One Row reused by Get across rows of other sizes, a miss, and another
// thread: each hit copies its row whole (the view as long as that row, not
// as the buffer a longer row left) and is counted once, whichever of Get's
// two paths took it (the leaf path for a row under 2 KB that the Row's
// buffer holds, read by the thread counting in the process's lane; the
// full path otherwise: cache_read.cc).
TEST_F(IntegrationTest, AReusedRowGetsEachRowWholeAndEachHitIsCountedOnce) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  const size_t sizes[] = {1024, 3072, 100, 1024, 2000};
  size_t encoded[std::size(sizes)];
  for (uint64_t id = 0; id < std::size(sizes); ++id) {
    ASSERT_TRUE(PutPattern(*cache, id, 0, sizes[id]).ok());
    RowView view;
    ASSERT_TRUE(cache->View(id, &view).ok());
    encoded[id] = view.encoded().size();
  }
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  uint64_t hits = st.hits;
  Row row;
  auto expect_row = [&](const Row& got, uint64_t id) {
    EXPECT_TRUE(RowMatches(got, id, 0, sizes[id])) << id;
    EXPECT_EQ(got.view().encoded().size(), encoded[id]) << id;
  };
  for (uint64_t id : {0, 3, 1, 2, 0, 4, 2}) {
    ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
    ++hits;
    expect_row(row, id);
  }
  EXPECT_TRUE(cache->Get(99, &row).IsNotFound());
  EXPECT_EQ(row.num_columns(), 0u) << "a miss leaves the Row empty";
  ASSERT_TRUE(cache->Get(3, &row).ok());
  ++hits;
  expect_row(row, 3);
  std::thread other([&] {
    Row own;
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(cache->Get(2, &own).ok());
      expect_row(own, 2);
    }
  });
  other.join();
  hits += 2;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.hits, hits);
  EXPECT_EQ(st.misses, 1u);
}

// GetBatchUncounted reads as GetBatch does and leaves the counters alone
// (a loader's read-back of rows its workers stored: counted once already).
TEST_F(IntegrationTest, GetBatchUncountedReadsAsGetBatchAndCountsNothing) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 3, 0, kRowBytes).ok());
  ASSERT_TRUE(PutPattern(*cache, 4, 0, kRowBytes).ok());
  const uint64_t ids[] = {3, 9, 4};
  Row rows[3];
  Status statuses[3];
  ASSERT_TRUE(cache->GetBatchUncounted(ids, rows, statuses).ok());
  EXPECT_TRUE(statuses[0].ok() && statuses[2].ok());
  EXPECT_TRUE(statuses[1].IsNotFound()) << statuses[1].ToString();
  EXPECT_TRUE(RowMatches(rows[0], 3, 0, kRowBytes));
  EXPECT_TRUE(RowMatches(rows[2], 4, 0, kRowBytes));
  EXPECT_EQ(rows[1].num_columns(), 0u);
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.hits, 0u);
  EXPECT_EQ(st.misses, 0u);
  ASSERT_TRUE(cache->GetBatch(ids, rows, statuses).ok());  // the counted read
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_TRUE(
      cache->GetBatchUncounted(ids, std::span(rows, 2), statuses).IsInvalidArgument());
}

// Rows of the streaming copy's sizes (format/row_copy.h) read back whole
// through each way a row is copied out: Get, GetBatch (with memcpy, and
// with streaming stores for a batch larger than the CPU's cache share), a
// BatchReader into a batch whose rows are not 16-byte aligned.
TEST_F(IntegrationTest, LargeRowsReadBackWholeThroughEveryCopy) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  const std::vector<size_t> sizes = {size_t{150} * 1024, size_t{600} * 1024 + 24,
                                     size_t{1024} * 1024};
  for (uint64_t id = 0; id < sizes.size(); ++id) {
    ASSERT_TRUE(PutPattern(*cache, id, 3, sizes[id]).ok());
  }
  for (uint64_t id = 0; id < sizes.size(); ++id) {
    Row row;
    ASSERT_TRUE(cache->Get(id, &row).ok());
    EXPECT_TRUE(RowMatches(row, id, 3, sizes[id])) << sizes[id];
  }
  std::vector<uint64_t> ids = {2, 0, 1, 0};
  std::vector<Row> rows(ids.size());
  std::vector<Status> st(ids.size());
  ASSERT_TRUE(cache->GetBatch(ids, rows, st).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(st[i].ok()) << st[i].ToString();
    EXPECT_TRUE(RowMatches(rows[i], ids[i], 3, sizes[ids[i]])) << i;
  }
  // A batch whose 1 MB rows outgrow this CPU's cache share, so that they
  // are copied with streaming stores (format/row_copy.h), whatever the
  // share; its one 600 KB row with memcpy on this VM (a 16 MB share).
  const size_t streamed = CacheShareBytes() / sizes[2] + 2;
  ASSERT_TRUE(StreamsRows(sizes[2], streamed, CacheShareBytes()));
  std::vector<uint64_t> many(streamed, 2);
  many[1] = 1;
  std::vector<Row> big(streamed);
  std::vector<Status> big_st(streamed);
  ASSERT_TRUE(cache->GetBatch(many, big, big_st).ok());
  for (size_t i = 0; i < many.size(); ++i) {
    ASSERT_TRUE(big_st[i].ok()) << big_st[i].ToString();
    EXPECT_TRUE(RowMatches(big[i], many[i], 3, sizes[many[i]])) << i;
  }
  // Two rows of the 600 KB + 24 size into one batch: the second lands 8
  // bytes past a 16-byte boundary.
  BatchReader reader(cache.get(), 2);
  const size_t n = sizes[1];
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  std::vector<uint8_t> batch(2 * n + 8, 0xEE);
  ColumnTarget target{"data", DType::kUInt8, shape, batch.data() + 8, n};
  std::vector<uint8_t> hit(2);
  const std::vector<uint64_t> same = {1, 1};
  ASSERT_TRUE(reader.ReadInto(same, std::span(&target, 1), hit).ok());
  EXPECT_EQ(hit, (std::vector<uint8_t>{1, 1}));
  const std::vector<uint8_t> want = Pattern(1, 3, n);
  EXPECT_EQ(std::memcmp(batch.data() + 8, want.data(), n), 0);
  EXPECT_EQ(std::memcmp(batch.data() + 8 + n, want.data(), n), 0);
  EXPECT_EQ(batch[7], 0xEE);
}

TEST_F(IntegrationTest, ColumnProjection) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  std::vector<float> image(size_t{3} * 8 * 8);
  for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<float>(i) / 3;
  int64_t label = 42;
  std::vector<uint8_t> patch0 = Pattern(1, 10, 100), patch1 = Pattern(1, 11, 100);
  int64_t img_shape[3] = {3, 8, 8}, one[1] = {1}, patch_shape[1] = {100};
  ColumnRef cols[] = {
      {"image", DType::kFloat32, img_shape, image.data(), image.size() * 4},
      {"label", DType::kInt64, one, &label, 8},
      {"patch0", DType::kUInt8, patch_shape, patch0.data(), 100},
      {"patch1", DType::kUInt8, patch_shape, patch1.data(), 100},
  };
  ASSERT_TRUE(cache->Put(3, cols).ok());
  Row row;
  std::string_view want[] = {"patch1", "label"};
  ASSERT_TRUE(cache->Get(3, want, &row).ok());
  ASSERT_EQ(row.num_columns(), 2u);
  EXPECT_EQ(row.column(0).name, "patch1");
  EXPECT_EQ(std::memcmp(row.column(0).data, patch1.data(), 100), 0);
  EXPECT_EQ(row.column(1).name, "label");
  EXPECT_EQ(*reinterpret_cast<const int64_t*>(row.column(1).data), 42);
  EXPECT_FALSE(row.find("image").has_value());
  // The whole row still has every column.
  ASSERT_TRUE(cache->Get(3, &row).ok());
  ASSERT_EQ(row.num_columns(), 4u);
  auto img = row.find("image");
  ASSERT_TRUE(img.has_value());
  EXPECT_EQ(img->dtype, DType::kFloat32);
  ASSERT_EQ(img->shape.size(), 3u);
  EXPECT_EQ(img->shape[1], 8);
  EXPECT_EQ(std::memcmp(img->data, image.data(), image.size() * 4), 0);
  // An absent column is NotFound, naming it.
  std::string_view absent[] = {"label", "mask"};
  Status s = cache->Get(3, absent, &row);
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_NE(s.message().find("mask"), std::string::npos) << s.ToString();
  // A malformed column is refused at Put.
  ColumnRef bad{"x", DType::kInt32, one, &label, 3};
  s = cache->Put(4, std::span(&bad, 1));
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_FALSE(cache->Contains(4));
}

// A missing column and a missing row are told apart (a caller handles them
// differently), and a read that fails leaves its row empty (row.h).
TEST_F(IntegrationTest, MissingColumnIsColumnNotFoundAndAMissingRowIsNot) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 3, 0, 100).ok());
  std::string_view data[] = {"data"}, absent[] = {"data", "mask"};
  Row row;
  ASSERT_TRUE(cache->Get(3, data, &row).ok());
  ASSERT_EQ(row.num_columns(), 1u);
  Status s = cache->Get(3, absent, &row);
  EXPECT_TRUE(s.IsColumnNotFound()) << s.ToString();
  EXPECT_TRUE(s.IsNotFound()) << "still a NotFound for callers that take it as a miss";
  EXPECT_NE(s.message().find("row 3 has no column 'mask'"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(row.num_columns(), 0u) << "a failed read leaves the row empty";
  s = cache->Get(4, data, &row);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_FALSE(s.IsColumnNotFound()) << s.ToString();
}

// Out-parameters after an error (status.h): reads empty their row or view,
// a batch fills every status, other calls leave their output unchanged.
TEST_F(IntegrationTest, OutputsAfterAnErrorAreAsTheHeadersState) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 0, 0, 100).ok());
  Row row;
  RowView view;
  CacheStats st;
  ASSERT_TRUE(cache->Get(0, &row).ok());
  ASSERT_TRUE(cache->View(0, &view).ok());
  ASSERT_TRUE(cache->GetStats(&st).ok());
  cache->Close();
  EXPECT_TRUE(cache->Get(0, &row).IsInvalidArgument());
  EXPECT_EQ(row.num_columns(), 0u);
  EXPECT_TRUE(cache->View(0, &view).IsInvalidArgument());
  EXPECT_TRUE(view.empty());
  st.hits = 12345;
  EXPECT_TRUE(cache->GetStats(&st).IsInvalidArgument());
  EXPECT_EQ(st.hits, 12345u) << "GetStats left *out as it was";
  const uint64_t ids[] = {0, 1};
  Row rows[2];
  Status statuses[2];
  EXPECT_TRUE(cache->GetBatch(ids, rows, statuses).IsInvalidArgument());
  RowView views[2];
  Status view_statuses[2];
  EXPECT_TRUE(cache->ViewBatch(ids, views, view_statuses).IsInvalidArgument());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(statuses[i].IsInvalidArgument()) << i << ": " << statuses[i].ToString();
    EXPECT_TRUE(view_statuses[i].IsInvalidArgument()) << i;
  }
}

// Batch outputs are spans: one of another length than the ids is refused
// before anything is read, stored or written.
TEST_F(IntegrationTest, BatchOutputsOfAnotherLengthAreInvalidArguments) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 0, 0, 100).ok());
  const uint64_t ids[] = {0, 1};
  Row rows[2];
  Status statuses[3] = {Status::Corruption("untouched"), Status::Corruption("untouched"),
                        Status::Corruption("untouched")};
  Status s = cache->GetBatch(ids, rows, statuses);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("2 ids but 3 statuses"), std::string::npos) << s.ToString();
  EXPECT_EQ(statuses[0], Status::Corruption("untouched"));
  EXPECT_EQ(rows[0].num_columns(), 0u);
  RowView views[1];
  EXPECT_TRUE(cache->ViewBatch(ids, views, std::span(statuses, 2)).IsInvalidArgument());
  std::vector<uint8_t> bytes(10);
  int64_t shape[1] = {10};
  ColumnRef col{"data", DType::kUInt8, shape, bytes.data(), bytes.size()};
  const uint64_t new_ids[] = {5, 6};
  std::span<const ColumnRef> one_row[] = {std::span(&col, 1)};
  EXPECT_TRUE(
      cache->PutBatch(new_ids, one_row, std::span(statuses, 2)).IsInvalidArgument());
  std::span<const ColumnRef> two_rows[] = {std::span(&col, 1), std::span(&col, 1)};
  bool inserted[1] = {true};
  EXPECT_TRUE(cache->PutBatch(new_ids, two_rows, std::span(statuses, 2), inserted)
                  .IsInvalidArgument());
  EXPECT_TRUE(inserted[0]);
  EXPECT_FALSE(cache->Contains(5));
  EXPECT_FALSE(cache->Contains(6));
}

}  // namespace
}  // namespace shmcache::test
