// Spilled puts through a staging file (lib/spill_stage.h, daemon/
// spill_stages.h, CacheSpiller::WriteStaged): rows encoded into shared
// memory and written by the daemon in one batch read back whole, in this
// process and others; a stage goes with its connection, and with a writer
// killed in the middle of staging; staged bytes that are not whole rows of
// their ids are refused and nothing of them is written; a full spill disk
// stops spilling and training goes on; a restarted server serves what was
// written and removes the stages of the killed one. Every test runs its own
// daemon.
#include <linux/sockios.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "format/instance.h"
#include "format/protocol_messages.h"
#include "format/row_codec.h"
#include "format/shm_file.h"
#include "lib/connection.h"
#include "shmcache/client.h"
#include "tests/support/capacity_helpers.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"
#include "tests/support/row_pattern.h"
#include "tests/support/spilling_cache_test.h"
#include "tests/support/test_server.h"
#include "tests/support/tmpfs_mount.h"
#include "tests/support/wait_for.h"

namespace shmcache::test {
namespace {

// The staged-spill tests that begin as most spill tests do: a spill dir, a daemon, a
// session and a 1 MB spilling cache of their own (spilling_cache_test.h).
using StagedSpillTest = SpillingCacheTest;

constexpr size_t kBatch = 64;
constexpr uint64_t kSalt = 7;  // PutRows's, so CheckRowsInChild reads them

// The staging files of this server's instance.
std::vector<std::string> Stages(const TestServer& server) {
  std::vector<std::string> out;
  for (const std::string& f : server.ShmFiles()) {
    if (f.find(".stage.") != std::string::npos) out.push_back(f);
  }
  return out;
}

// PutBatch of rows [first, first + n) of kRowBytes, kBatch at a time; every
// status must be OK.
void PutBatches(Cache* cache, uint64_t first, size_t n) {
  for (uint64_t b = first; b < first + n; b += kBatch) {
    const size_t k = std::min<size_t>(kBatch, first + n - b);
    std::vector<Status> st(k);
    std::unique_ptr<bool[]> inserted(new bool[k]);
    ASSERT_TRUE(PutRowBatch(cache, b, st, std::span(inserted.get(), k), kSalt).ok());
    for (size_t i = 0; i < k; ++i) {
      ASSERT_TRUE(st[i].ok()) << b + i << ": " << st[i].ToString();
      EXPECT_TRUE(inserted[i]) << b + i;
    }
  }
}

TEST_F(StagedSpillTest, BatchesOfSpilledRowsReadBackWholeEverywhere) {
  const size_t n = (8u << 20) / kRowBytes;  // 8 MB of rows, a 1 MB budget
  ASSERT_NO_FATAL_FAILURE(PutBatches(cache_.get(), 0, n));
  CacheStats st;
  ASSERT_TRUE(cache_->GetStats(&st).ok());
  EXPECT_GT(st.disk_rows, n / 2);
  EXPECT_EQ(st.mem_rows + st.disk_rows, n);
  EXPECT_EQ(Stages(server_).size(), 1u) << "the rows went through one staging file";
  // A second batch of the same ids adds nothing: the first writer won.
  std::vector<uint8_t> other(kRowBytes, 0xAB);
  bool inserted = true;
  ASSERT_TRUE(cache_->Put(n - 1, other.data(), other.size(), &inserted).ok());
  EXPECT_FALSE(inserted);
  EXPECT_EQ(CheckRowsInChild(server_, session_, n, true, kSalt), static_cast<long>(n));
  // Single puts of spilled rows go through the stage too.
  ASSERT_TRUE(PutBytes(cache_.get(), n, kRowBytes, &inserted).ok());
  EXPECT_TRUE(inserted);
  EXPECT_EQ(CheckRowsInChild(server_, session_, n + 1, true, kSalt),
            static_cast<long>(n + 1));
  // The stage goes with the connection that asked for it.
  cache_.reset();
  EXPECT_TRUE(WaitFor([&] { return Stages(server_).empty(); }, std::chrono::seconds(10)))
      << testing::PrintToString(Stages(server_));
  // And with its cache, while the connection lives on.
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server_.Connect(&client).ok());
  uint32_t second = 0;
  ASSERT_TRUE(client->CreateSession(&second).ok());
  std::unique_ptr<Cache> again;
  ASSERT_TRUE(client->OpenCache(CacheNamed(second, "capacity", 1, true), &again).ok());
  ASSERT_NO_FATAL_FAILURE(PutBatches(again.get(), 0, n));
  ASSERT_EQ(Stages(server_).size(), 1u);
  ASSERT_TRUE(client->DestroySession(second).ok());
  EXPECT_TRUE(Stages(server_).empty()) << testing::PrintToString(Stages(server_));
}

TEST_F(StagedSpillTest, WriterKilledWhileStagingLeavesWholeRowsAndNoStage) {
  // The writer stages batch after batch of new rows until it is killed.
  pid_t writer = ForkChild([&] {
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> c;
    if (!server_.Connect(&client).ok() ||
        !client->OpenCache(CacheNamed(session_, "capacity", 1, true), &c).ok()) {
      return 1;
    }
    for (uint64_t b = 0;; b += kBatch) {
      PutBatches(c.get(), b, kBatch);
      if (testing::Test::HasFailure()) return 2;
    }
  });
  CacheStats st;
  ASSERT_TRUE(WaitFor([&] { return cache_->GetStats(&st).ok() && st.disk_rows > 2000; },
                      std::chrono::seconds(60)));
  ASSERT_EQ(kill(writer, SIGKILL), 0);
  int status = 0;
  ASSERT_TRUE(WaitChild(writer, &status, std::chrono::seconds(30)));
  EXPECT_TRUE(WIFSIGNALED(status)) << status;
  // Its stage went with its connection.
  EXPECT_TRUE(WaitFor([&] { return Stages(server_).empty(); }, std::chrono::seconds(10)))
      << testing::PrintToString(Stages(server_));
  // Every row the index holds is whole; the rows it held are rows 0..k-1
  // of whole batches, in order.
  ASSERT_TRUE(cache_->GetStats(&st).ok());
  const uint64_t held = st.mem_rows + st.disk_rows;
  EXPECT_EQ(CheckRowsInChild(server_, session_, held, true, kSalt),
            static_cast<long>(held));
  Row row;
  EXPECT_TRUE(cache_->Get(held + kBatch, &row).IsNotFound());
  // The server goes on spilling for others.
  ASSERT_NO_FATAL_FAILURE(PutBatches(cache_.get(), held + 2 * kBatch, kBatch));
}

// Forks a child that shuts down the sockets this process holds now once
// one holds a request the peer has not read yet (SIOCOUTQ): the caller
// waiting for its answer sees its connection end, while the request stays
// for the peer to read. The child exits 0 once it shut one down, 1 if none
// came within 30 s. A child, not a thread: the socket is the same one in
// both processes, and a thread scanning this process's descriptors races
// the library's close of them (the kernel orders the shutdown before the
// close it causes, which ThreadSanitizer cannot see; and a descriptor
// closed and given again mid-scan is another one).
pid_t BreakUnreadConnection() {
  std::vector<int> sockets;
  for (const std::string& name : ListDir("/proc/self/fd")) {
    const int fd = std::atoi(name.c_str());
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) sockets.push_back(fd);
  }
  return ForkChild([sockets] {
    // System calls only: a child of a process that may have threads.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      bool broke = false;
      for (int fd : sockets) {
        int queued = 0;
        if (ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0) {
          shutdown(fd, SHUT_RDWR);
          broke = true;
        }
      }
      if (broke) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return 1;
  });
}

// Spilled rows whose answer never came (the connection broke while the
// daemon, stopped, had not read the request): the daemon copies them out of
// the stage once it runs again, so the writer never stages rows there again
// (a row overwritten while the daemon copies it would be stored torn).
TEST_F(StagedSpillTest, AStageWhoseAnswerWasLostIsNotWrittenAgain) {
  ASSERT_NO_FATAL_FAILURE(PutBatches(cache_.get(), 0, 1000));  // spills through a stage
  const std::vector<std::string> stages = Stages(server_);
  ASSERT_EQ(stages.size(), 1u);
  ShmFile stage;  // this test's own view of it
  Status opened = ShmFile::Open(server_.shm_dir() + "/" + stages[0], &stage);
  ASSERT_TRUE(opened.ok()) << opened.ToString();

  const ContinuedAfter continued(server_.pid());  // however the test ends
  ASSERT_TRUE(StopProcess(server_.pid()));
  const pid_t breaker = BreakUnreadConnection();
  ASSERT_GT(breaker, 0);
  std::vector<Status> st(kBatch);
  Status s = PutRowBatch(cache_.get(), 1000, st, {}, kSalt);
  const bool broke = WaitChild(breaker) == 0;
  const std::string after_lost(stage.data(), stage.size());
  ASSERT_EQ(kill(server_.pid(), SIGCONT), 0);
  ASSERT_TRUE(broke);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(st[0].IsUnavailable()) << st[0].ToString();

  ASSERT_NO_FATAL_FAILURE(PutBatches(cache_.get(), 2000, kBatch));
  EXPECT_EQ(std::memcmp(stage.data(), after_lost.data(), after_lost.size()), 0)
      << "rows were staged into the stage of the request that got no answer";
  // What the daemon read from it is whole; the rest reads back right.
  EXPECT_EQ(CheckRowsInChild(server_, session_, 1000, true, kSalt), 1000);
}

// A client of the protocol itself: the rows it stages are not whole rows
// of the ids it names.
TEST_F(StagedSpillTest, StagedBytesThatAreNotWholeRowsAreRefusedAndNothingIsWritten) {
  ASSERT_EQ(PutRows(cache_.get(), 1000), 1000u);  // memory used up: rows spill now
  std::unique_ptr<Connection> conn;
  ASSERT_TRUE(Connection::Open(server_.socket_path(), server_.port(), 5000, &conn).ok());
  auto call = [&](const auto& request, auto* response) {
    std::string body;
    size_t off = 0;
    Status s =
        conn->Call(std::decay_t<decltype(request)>::kType, protocol::EncodeBody(request),
                   &body, &off, protocol::kDiskRequestTimeoutMs);
    if (!s.ok()) return s;
    protocol::WireReader r(
        std::as_bytes(std::span(body.data(), body.size())).subspan(off));
    EXPECT_TRUE(protocol::DecodeMessage(&r, response));
    return s;
  };
  protocol::HelloResponse hello;
  ASSERT_TRUE(call(protocol::HelloRequest{}, &hello).ok());
  protocol::SpillStageResponse stage;
  ASSERT_TRUE(
      call(protocol::SpillStageRequest{.cache_id = cache_->cache_id(), .min_bytes = 4096},
           &stage)
          .ok());
  InstancePaths paths =
      MakeInstancePaths(server_.port(), server_.run_dir(), server_.shm_dir());
  ShmFile file;
  ASSERT_TRUE(ShmFile::Open(paths.StageFile(cache_->cache_id(), stage.tag), &file).ok());
  // Row 5000 encoded whole, staged as row 5001; then as itself but one
  // byte short; then bytes past the stage.
  std::vector<uint8_t> data = Pattern(5000, kSalt, kRowBytes);
  int64_t shape[1] = {static_cast<int64_t>(kRowBytes)};
  ColumnRef col{"data", DType::kUInt8, shape, data.data(), kRowBytes};
  size_t size = 0;
  ASSERT_TRUE(RowCodec::EncodedSize(std::span(&col, 1), &size).ok());
  RowCodec::Encode(5000, std::span(&col, 1), reinterpret_cast<std::byte*>(file.data()),
                   size);
  protocol::SpillPutStagedResponse answer;
  const std::vector<protocol::SpillPutStagedRequest> bad = {
      {.cache_id = cache_->cache_id(),
       .tag = stage.tag,
       .ids = {5001},
       .sizes = {static_cast<uint32_t>(size)}},
      {.cache_id = cache_->cache_id(),
       .tag = stage.tag,
       .ids = {5000},
       .sizes = {static_cast<uint32_t>(size - 8)}},
      {.cache_id = cache_->cache_id(),
       .tag = stage.tag,
       .ids = {5000, 5002},
       .sizes = {static_cast<uint32_t>(size), static_cast<uint32_t>(stage.size)}},
      {.cache_id = cache_->cache_id(),
       .tag = stage.tag + 1,
       .ids = {5000},
       .sizes = {static_cast<uint32_t>(size)}}};
  for (const auto& request : bad) {
    Status s = call(request, &answer);
    EXPECT_TRUE(s.IsCorruption() || s.IsNotFound()) << s.ToString();
  }
  Row row;
  for (uint64_t id : {5000, 5001, 5002}) {
    EXPECT_TRUE(cache_->Get(id, &row).IsNotFound()) << id;
  }
  // The same stage with the row named right is written and served.
  ASSERT_TRUE(
      call(protocol::SpillPutStagedRequest{.cache_id = cache_->cache_id(),
                                           .tag = stage.tag,
                                           .ids = {5000},
                                           .sizes = {static_cast<uint32_t>(size)}},
           &answer)
          .ok());
  EXPECT_EQ(answer.inserted, std::vector<uint8_t>{1});
  ASSERT_TRUE(cache_->Get(5000, &row).ok());
  auto got = row.find("data");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(0, std::memcmp(got->data, data.data(), kRowBytes));
  // The connection ends: its stage is removed (the cache's own stays).
  const std::string path = paths.StageFile(cache_->cache_id(), stage.tag);
  file.Unmap();
  conn.reset();
  EXPECT_TRUE(
      WaitFor([&] { return access(path.c_str(), F_OK) != 0; }, std::chrono::seconds(10)))
      << path;
  EXPECT_EQ(Stages(server_).size(), 1u) << testing::PrintToString(Stages(server_));
}

TEST(SpillStageTest, FullSpillDiskStopsSpillingAndWhatWasStoredStaysWhole) {
  TmpfsMount spill("32m");
  if (!spill.mounted()) GTEST_SKIP() << spill.skip_reason();
  {
    TestServer server(WithArgs({"-s", spill.path()}));
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    uint32_t session = server.NewSession();
    auto cache = OpenCache(server, session, 1, true);
    // Batches until the disk is full: far more than 1 MB + 32 MB.
    const size_t n = (64u << 20) / kRowBytes;
    std::vector<Status> st(kBatch);
    uint64_t stored = 0;
    bool full = false;
    for (uint64_t b = 0; b < n && !full; b += kBatch) {
      ASSERT_TRUE(PutRowBatch(cache.get(), b, st, {}, kSalt).ok());
      for (size_t i = 0; i < kBatch; ++i) {
        if (st[i].IsFull()) {
          full = true;
        } else {
          ASSERT_TRUE(st[i].ok()) << st[i].ToString();
          ASSERT_FALSE(full) << "a row stored after one was refused";
          ++stored;
        }
      }
    }
    EXPECT_TRUE(full);
    EXPECT_GT(stored, 0u);
    EXPECT_TRUE(cache->IsFull());
    // Reads keep working and return exactly what was stored.
    EXPECT_EQ(CheckRowsInChild(server, session, n, true, kSalt),
              static_cast<long>(stored));
  }
}

TEST(SpillStageTest, RestartedServerServesStagedRowsAndRemovesOldStages) {
  TempDir spill_dir(TestTmpRoot());
  const std::string& spill = spill_dir.path();
  {
    auto first = std::make_unique<TestServer>(WithArgs({"-s", spill}));
    ASSERT_TRUE(first->ok()) << first->start_result().Describe();
    uint32_t session = first->NewSession();
    const size_t n = (4u << 20) / kRowBytes;
    {
      auto cache = OpenCache(*first, session, 1, true);
      ASSERT_NO_FATAL_FAILURE(PutBatches(cache.get(), 0, n));
      ASSERT_EQ(Stages(*first).size(), 1u);
      first->Kill();  // while the client still holds its stage
    }
    ASSERT_EQ(Stages(*first).size(), 1u) << "a killed server removes nothing";
    TestServer second(SameInstance(*first, {"-s", spill}));
    ASSERT_TRUE(second.ok()) << second.start_result().Describe();
    EXPECT_TRUE(Stages(second).empty()) << testing::PrintToString(Stages(second));
    EXPECT_EQ(CheckRowsInChild(second, session, n, true, kSalt), static_cast<long>(n));
    // And takes staged rows again.
    auto cache = OpenCache(second, session, 1, true);
    ASSERT_NO_FATAL_FAILURE(PutBatches(cache.get(), n, kBatch));
    EXPECT_EQ(CheckRowsInChild(second, session, n + kBatch, true, kSalt),
              static_cast<long>(n + kBatch));
  }
}

}  // namespace
}  // namespace shmcache::test
