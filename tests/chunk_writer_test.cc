// ChunkWriter: a process's writes of rows into leased chunks, against a
// real daemon: rows published whole and found by a reader's TableSet and
// SegmentSet, the first row of an id kept, a chunk that is full replaced, a
// full index grown (a row left behind a full newest table carried into a
// new one, or its put failing where the newer table cannot be mapped), a
// lease the daemon refuses reported as such, and a forked child that never
// writes into its parent's chunks.
#include "lib/chunk_writer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/row_codec.h"
#include "tests/support/test_server.h"

namespace shmcache {
namespace {

class ChunkWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<test::TestServer>();
    ASSERT_TRUE(server_->ok());
    session_ = server_->NewSession();
    ASSERT_NE(session_, 0u);
  }
  void TearDown() override {
    writer_.reset();
    segments_.reset();
    tables_.reset();
    header_file_ = ShmFile();
    client_.reset();
    server_.reset();
  }
  // Opens cache `name` (size_mb: its budget) and the parts a writer needs.
  void Open(uint64_t size_mb = 0) {
    ASSERT_TRUE(ClientImpl::Create(server_->client_options(), &client_).ok());
    protocol::OpenCacheResponse opened;
    ASSERT_TRUE(client_
                    ->Call(protocol::OpenCacheRequest{.session_id = session_,
                                                      .name = "w",
                                                      .fingerprint = "w-fp",
                                                      .size_mb = size_mb},
                           &opened)
                    .ok());
    cache_id_ = opened.cache_id;
    ASSERT_TRUE(ShmFile::Open(client_->paths().CacheFile(cache_id_), &header_file_).ok());
    auto* header = reinterpret_cast<layout::CacheHeader*>(header_file_.data());
    auto paths = [c = client_.get()] { return c->paths(); };
    tables_ = std::make_unique<TableSet>(header, cache_id_, paths);
    ASSERT_TRUE(tables_->MapNew().ok());
    segments_ = std::make_unique<SegmentSet>(cache_id_, paths);
    writer_ = std::make_unique<ChunkWriter>(client_, cache_id_, 1, segments_.get(),
                                            tables_.get());
  }
  // Writes row `id` of `bytes` bytes, each (id + i) & 0xff, as one batch.
  Status Write(uint64_t id, size_t bytes, bool* inserted = nullptr,
               bool* lease_failed = nullptr) {
    std::vector<uint8_t> data(bytes);
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(id + i);
    const int64_t shape[1] = {static_cast<int64_t>(bytes)};
    const ColumnRef col{"d", DType::kUInt8, shape, data.data(), bytes};
    size_t size = 0;
    Status s = RowCodec::EncodedSize(std::span(&col, 1), &size);
    if (!s.ok()) return s;
    ChunkWriter::BatchLock lock(writer_.get());
    bool added = false, failed = false;
    s = writer_->Write(id, std::span(&col, 1), size, &lock, &tally_, &added, &failed);
    if (inserted) *inserted = added;
    if (lease_failed) *lease_failed = failed;
    return s;
  }
  // Opens the cache and writes row 1 into table 0; then another process
  // grows the index (table 0 is copied into table 1 and lookups probe
  // table 1 alone) while this writer has not mapped table 1: the stale
  // writer of TableSet::Publish's race.
  void GrowBehindThisWriter() {
    Open();
    ASSERT_TRUE(Write(1, 8).ok());
    ASSERT_EQ(tables_->Mapped(), 1u);
    ASSERT_TRUE(
        client_->Call(protocol::GrowIndexRequest{.cache_id = cache_id_, .seen_tables = 1})
            .ok());
  }
  // True when row `id` of `bytes` bytes reads back whole; *loc: where.
  bool ReadsBack(uint64_t id, size_t bytes, uint64_t* loc = nullptr) {
    const uint64_t at = tables_->Lookup(id);
    if (loc) *loc = at;
    RowView view;
    int node = 0;
    if (at == layout::kEmpty || !segments_->Resolve(id, at, &view, &node).ok()) {
      return false;
    }
    const ColumnView c = view.column(0);
    if (c.nbytes != bytes) return false;
    for (size_t i = 0; i < bytes; ++i) {
      if (std::to_integer<uint8_t>(c.data[i]) != static_cast<uint8_t>(id + i)) {
        return false;
      }
    }
    return true;
  }

  std::unique_ptr<test::TestServer> server_;
  uint32_t session_ = 0;
  std::shared_ptr<ClientImpl> client_;
  uint32_t cache_id_ = 0;
  ShmFile header_file_;
  std::unique_ptr<TableSet> tables_;
  std::unique_ptr<SegmentSet> segments_;
  std::unique_ptr<ChunkWriter> writer_;
  ChunkWriter::Tally tally_;
};

TEST_F(ChunkWriterTest, RowsArePublishedWholeOneAfterAnotherInTheChunk) {
  Open();
  bool inserted = false;
  ASSERT_TRUE(Write(1, 100, &inserted).ok());
  EXPECT_TRUE(inserted);
  ASSERT_TRUE(Write(2, 100, &inserted).ok());
  uint64_t loc1 = 0, loc2 = 0;
  EXPECT_TRUE(ReadsBack(1, 100, &loc1));
  EXPECT_TRUE(ReadsBack(2, 100, &loc2));
  EXPECT_EQ(layout::LocationSegment(loc1), layout::LocationSegment(loc2));
  EXPECT_GT(layout::LocationOffset(loc2), layout::LocationOffset(loc1));
  EXPECT_EQ(tally_.rows, 2u);
  EXPECT_EQ(tally_.bytes, 2 * (loc2 - loc1)) << "two rows of one size, back to back";
}

TEST_F(ChunkWriterTest, TheFirstRowOfAnIdWinsAndTheSecondsSpaceIsTakenBack) {
  Open();
  bool inserted = true;
  ASSERT_TRUE(Write(1, 100).ok());
  ASSERT_TRUE(Write(1, 100, &inserted).ok());
  EXPECT_FALSE(inserted);
  ASSERT_TRUE(Write(2, 100).ok());
  uint64_t loc1 = 0, loc2 = 0;
  ASSERT_TRUE(ReadsBack(1, 100, &loc1));
  ASSERT_TRUE(ReadsBack(2, 100, &loc2));
  EXPECT_EQ(tally_.rows, 2u);
  EXPECT_EQ(layout::LocationOffset(loc2) - layout::LocationOffset(loc1), tally_.bytes / 2)
      << "row 2 sits where the dropped copy of row 1 was written";
}

TEST_F(ChunkWriterTest, ARowThatDoesNotFitLeasesANewChunk) {
  Open();
  constexpr size_t kRow = 1536 << 10;  // a few per 4 MB chunk
  std::vector<uint64_t> offsets;
  for (uint64_t id = 0; id < 8; ++id) ASSERT_TRUE(Write(id, kRow).ok()) << id;
  uint64_t first = 0, last = 0;
  for (uint64_t id = 0; id < 8; ++id) {
    uint64_t loc = 0;
    EXPECT_TRUE(ReadsBack(id, kRow, &loc)) << id;
    if (id == 0) first = loc;
    last = loc;
  }
  EXPECT_NE(first, last);
  EXPECT_EQ(tally_.rows, 8u);
}

TEST_F(ChunkWriterTest, AFullIndexTableIsGrown) {
  Open();
  const uint32_t before = tables_->Mapped();
  const uint64_t rows = (1u << 18) * 3 / 4 + 10;  // past the first table's limit
  for (uint64_t id = 0; id < rows; ++id) ASSERT_TRUE(Write(id, 8).ok()) << id;
  EXPECT_GT(tables_->Mapped(), before);
  for (uint64_t id = 0; id < rows; id += 997) EXPECT_TRUE(ReadsBack(id, 8)) << id;
  EXPECT_TRUE(ReadsBack(rows - 1, 8));
}

// The race the compaction leaves to the writer (TableSet::Publish): a
// writer whose tables are stale publishes in table 0 after the daemon
// copied table 0 into table 1, and table 1 filled meanwhile (other
// writers), so the row cannot follow there. The writer grows the index and
// publishes the row in the new table, where every reader finds it; before,
// it stayed in table 0, which no lookup probes.
TEST_F(ChunkWriterTest, ARowPublishedBehindAFullNewestTableIsCarriedIntoAGrownOne) {
  ASSERT_NO_FATAL_FAILURE(GrowBehindThisWriter());
  auto* header = reinterpret_cast<layout::CacheHeader*>(header_file_.data());
  ASSERT_EQ(header->first_table.load(), 1u);
  // Other writers fill table 1 to its limit (locations nobody reads).
  ShmFile f1;
  ASSERT_TRUE(
      ShmFile::Open(client_->paths().TableFile(cache_id_, 1, header->tables[1].tag), &f1)
          .ok());
  IndexTable t1(reinterpret_cast<layout::TableHeader*>(f1.data()));
  uint64_t filler = 1ULL << 40;
  while (t1.Insert(filler++, layout::MakeLocation(1, 4096)) !=
         IndexTable::InsertResult::kTableFull) {
  }
  bool inserted = false;
  ASSERT_TRUE(Write(2, 8, &inserted).ok());
  EXPECT_TRUE(inserted);
  EXPECT_EQ(tally_.rows, 2u);
  EXPECT_EQ(header->num_tables.load(), 3u) << "the writer grew the index";
  TableSet fresh(header, cache_id_, [c = client_.get()] { return c->paths(); });
  ASSERT_TRUE(fresh.MapNew().ok());
  EXPECT_NE(fresh.LookupMapped(2), layout::kEmpty) << "a reader that maps every table";
  EXPECT_TRUE(ReadsBack(2, 8)) << "the writer's own lookup";
  EXPECT_TRUE(ReadsBack(1, 8));
}

// The same stale writer, but the newer table cannot be mapped (its file
// does not match the header's entry): the row stays behind, published
// (its room is never taken back), and the put says why instead of OK.
TEST_F(ChunkWriterTest, ARowThatCannotReachAnUnmappableTableReportsWhy) {
  ASSERT_NO_FATAL_FAILURE(GrowBehindThisWriter());
  auto* header = reinterpret_cast<layout::CacheHeader*>(header_file_.data());
  const uint64_t cap = header->tables[1].capacity.load();
  header->tables[1].capacity.store(cap * 2);  // not the file's
  bool inserted = false;
  const Status s = Write(2, 8, &inserted);
  header->tables[1].capacity.store(cap);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_TRUE(inserted) << "published in table 0: its room is the row's";
  EXPECT_EQ(tally_.rows, 2u);
  const uint64_t loc2 = tables_->table(0).Find(2);
  ASSERT_NE(loc2, layout::kEmpty) << "published in table 0";
  ASSERT_TRUE(Write(3, 8).ok()) << "table 1 maps again";
  uint64_t loc3 = 0;
  ASSERT_TRUE(ReadsBack(3, 8, &loc3));
  EXPECT_GT(layout::LocationOffset(loc3), layout::LocationOffset(loc2))
      << "row 3 is not written in row 2's room";
}

TEST_F(ChunkWriterTest, ALeaseTheDaemonRefusesIsReportedAndTheRowsBeforeStay) {
  Open(/*size_mb=*/8);
  constexpr size_t kRow = 1 << 20;
  Status s;
  bool lease_failed = false;
  uint64_t id = 0;
  // Counted as the cache counts them: the daemon refuses a row alone
  // (TooLarge) while rows of the size counted still fit.
  auto* header = reinterpret_cast<layout::CacheHeader*>(header_file_.data());
  for (; id < 64 && s.ok(); ++id) {
    s = Write(id, kRow, nullptr, &lease_failed);
    if (s.ok()) {
      header->stats[0].rows.fetch_add(1);
      header->stats[0].bytes.fetch_add(kRow);
    }
  }
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_TRUE(lease_failed);
  for (uint64_t k = 0; k + 1 < id; ++k) EXPECT_TRUE(ReadsBack(k, kRow)) << k;
  EXPECT_EQ(tables_->Lookup(id - 1), layout::kEmpty) << "the refused row";
}

TEST_F(ChunkWriterTest, AForkedChildLeasesItsOwnChunk) {
  Open();
  ASSERT_TRUE(Write(1, 100).ok());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    tally_ = {};
    bool ok = Write(2, 100).ok() && ReadsBack(2, 100);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(Write(3, 100).ok());
  uint64_t loc1 = 0, loc2 = 0, loc3 = 0;
  ASSERT_TRUE(ReadsBack(1, 100, &loc1));
  ASSERT_TRUE(ReadsBack(2, 100, &loc2));
  ASSERT_TRUE(ReadsBack(3, 100, &loc3));
  EXPECT_EQ(loc3 - loc1, tally_.bytes / 2) << "the parent's chunk goes on after row 1";
  EXPECT_TRUE(loc2 < loc1 || loc2 > loc3) << "the child's row is in a chunk of its own";
}

TEST_F(ChunkWriterTest, AReturnedChunksTailIsLeasedToTheNextWriter) {
  Open();
  ASSERT_TRUE(Write(1, 100).ok());
  writer_->ReturnChunks();
  // Another connection of this process writes next.
  std::shared_ptr<ClientImpl> other;
  ASSERT_TRUE(ClientImpl::Create(server_->client_options(), &other).ok());
  writer_ =
      std::make_unique<ChunkWriter>(other, cache_id_, 1, segments_.get(), tables_.get());
  ASSERT_TRUE(Write(2, 100).ok());
  uint64_t loc1 = 0, loc2 = 0;
  ASSERT_TRUE(ReadsBack(1, 100, &loc1));
  ASSERT_TRUE(ReadsBack(2, 100, &loc2));
  EXPECT_EQ(layout::LocationSegment(loc1), layout::LocationSegment(loc2));
  EXPECT_GT(loc2, loc1);
  EXPECT_LT(loc2 - loc1, 4096u) << "in the first chunk's tail, not a chunk of its own";
}

}  // namespace
}  // namespace shmcache
