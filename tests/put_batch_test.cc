// Cache::PutBatch and the page preparation behind every put: rows of a
// batch are stored as Put would store them one by one, each with its own
// status, and mapping leased chunks never turns a full tmpfs into a SIGBUS.
// Every test runs its own daemon.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/layout.h"
#include "format/shm_file.h"
#include "shmcache/client.h"
#include "tests/support/capacity_helpers.h"
#include "tests/support/test_server.h"
#include "tests/support/tmpfs_mount.h"

namespace shmcache::test {
namespace {

constexpr uint64_t kSalt = 11;

// A batch of rows whose bytes live here: rows[i] is one uint8 column
// "data" over payload(i).
class Batch {
 public:
  void Add(uint64_t id, std::vector<uint8_t> bytes) {
    ids_.push_back(id);
    bytes_.push_back(std::move(bytes));
  }
  void AddPattern(uint64_t id, size_t n = kRowBytes) { Add(id, Pattern(id, kSalt, n)); }
  size_t size() const { return ids_.size(); }

  // PutBatch over everything added; statuses and inserted per row.
  Status Put(Cache* cache) {
    shapes_.resize(size());
    cols_.resize(size());
    rows_.resize(size());
    for (size_t i = 0; i < size(); ++i) {
      shapes_[i] = static_cast<int64_t>(bytes_[i].size());
      cols_[i] = ColumnRef{"data", DType::kUInt8, std::span(&shapes_[i], 1),
                           bytes_[i].data(), bytes_[i].size()};
      // A malformed row: its byte count does not match its shape.
      if (std::find(bad_.begin(), bad_.end(), i) != bad_.end()) cols_[i].nbytes += 1;
      rows_[i] = std::span(&cols_[i], 1);
    }
    statuses.assign(size(), Status::Corruption("not set"));
    inserted.reset(new bool[size()]);
    return cache->PutBatch(ids_, rows_, statuses, std::span(inserted.get(), size()));
  }
  void Malform(size_t i) { bad_.push_back(i); }

  std::vector<Status> statuses;
  std::unique_ptr<bool[]> inserted;

 private:
  std::vector<uint64_t> ids_;
  std::vector<std::vector<uint8_t>> bytes_;
  std::vector<int64_t> shapes_;
  std::vector<ColumnRef> cols_;
  std::vector<std::span<const ColumnRef>> rows_;
  std::vector<size_t> bad_;
};

std::unique_ptr<Cache> Open(const TestServer& server, uint32_t session,
                            uint64_t size_mb) {
  std::unique_ptr<Client> client;
  EXPECT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(CacheNamed(session, "batch", size_mb, false), &cache);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return cache;
}

// In a forked process: 0 when rows 0..n-1 are exactly those with want[i]
// true, each byte-identical to Pattern(i, kSalt, row_bytes).
int CheckRowsInChild(const TestServer& server, uint32_t session,
                     const std::vector<bool>& want, size_t row_bytes = kRowBytes) {
  pid_t pid = ForkChild([&]() -> int {
    std::unique_ptr<Cache> cache = OpenCacheInChild(server, session, 0, false, "batch");
    if (cache == nullptr) return 3;
    Row row;
    for (size_t i = 0; i < want.size(); ++i) {
      Status s = cache->Get(i, &row);
      if (s.IsNotFound() && !want[i]) continue;
      if (!s.ok() || !want[i]) return 5;
      auto col = row.find("data");
      std::vector<uint8_t> bytes = Pattern(i, kSalt, row_bytes);
      if (!col || col->nbytes != bytes.size() ||
          std::memcmp(col->data, bytes.data(), bytes.size()) != 0) {
        return 6;
      }
    }
    return 0;
  });
  return WaitChild(pid);
}

// Checks every chunk of the server's segments: its pages past its rows
// were never written (SEEK_DATA skips them: nobody cleared them ahead of a
// writer) and read as zero through a mapping in a forked process. Returns
// how many chunks there are.
int ChunksUnclearedPastTheirRows(const TestServer& server) {
  int chunks = 0;
  for (const std::string& name : server.ShmFiles()) {
    if (name.find("seg.") == std::string::npos) continue;
    const std::string path = server.shm_dir() + "/" + name;
    ShmFile f;
    if (!ShmFile::Open(path, &f).ok()) {
      ADD_FAILURE() << "cannot open " << path;
      return -1;
    }
    const auto* h = reinterpret_cast<const layout::ChunkHeader*>(
        f.data() + layout::kSegmentHeaderSize);
    if (h->magic != layout::kChunkMagic) continue;  // a segment made ahead of need
    ++chunks;
    const uint64_t from =
        (layout::kSegmentHeaderSize + h->used.load() + 4095) / 4096 * 4096;
    const uint64_t to = layout::kSegmentHeaderSize + h->size;
    const int fd = from < to ? open(path.c_str(), O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0) {
      ADD_FAILURE() << path << ": the rows fill the chunk, or it cannot be opened";
      return -1;
    }
    const off_t data = lseek(fd, static_cast<off_t>(from), SEEK_DATA);
    close(fd);
    EXPECT_TRUE(data < 0 || static_cast<uint64_t>(data) >= to)
        << "the chunk's page at " << data << " past its rows (" << from << "-" << to
        << ") was written: cleared ahead of the writer";
    pid_t pid = ForkChild([&]() -> int {
      ShmFile g;
      if (!ShmFile::Open(path, &g).ok()) return 3;
      for (uint64_t off = from; off < to; ++off) {
        if (g.data()[off] != 0) return 4;
      }
      return 0;
    });
    EXPECT_EQ(WaitChild(pid), 0) << "a page no row reached does not read as zero";
  }
  return chunks;
}

TEST(PutBatchTest, StoresEveryRowAndAnotherProcessReadsThemBack) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = Open(server, session, 0);
  // More rows than one 4 MB chunk holds: the batch leases several.
  const size_t n = 3000;
  for (size_t base = 0; base < n; base += 500) {
    Batch b;
    for (size_t i = base; i < base + 500; ++i) b.AddPattern(i);
    ASSERT_TRUE(b.Put(cache.get()).ok());
    for (size_t i = 0; i < b.size(); ++i) {
      ASSERT_TRUE(b.statuses[i].ok()) << i << ": " << b.statuses[i].ToString();
      EXPECT_TRUE(b.inserted[i]) << i;
    }
  }
  EXPECT_EQ(CheckRowsInChild(server, session, std::vector<bool>(n, true)), 0);
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, n);
}

// On a tmpfs of 4 KB pages the daemon leaves segment pages uncleared
// (kSegmentClearing) and a batch writes its rows through the segment's
// descriptor: another process reads them back byte for byte, and the pages
// of the leased chunk that no row reached are still uncleared (SEEK_DATA
// skips them: nobody wrote zeros there) yet read as zero through a mapping.
TEST(PutBatchTest, RowsGoIntoPagesNobodyClearedAndAPageNoRowReachedReadsZero) {
  TestServer server;  // its shm dir lies in /dev/shm
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = Open(server, session, 0);
  const size_t n = 64;  // 192 KB: the first chunk holds them
  Batch b;
  for (size_t i = 0; i < n; ++i) b.AddPattern(i);
  ASSERT_TRUE(b.Put(cache.get()).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(b.statuses[i].ok()) << i << ": " << b.statuses[i].ToString();
    EXPECT_TRUE(b.inserted[i]) << i;
  }
  EXPECT_EQ(CheckRowsInChild(server, session, std::vector<bool>(n, true)), 0);
  EXPECT_EQ(ChunksUnclearedPastTheirRows(server), 1);
}

// A single Put of a large row (a CachedLoader worker's put of each row it
// computes) goes through the descriptor too: the chunk it leases is not
// cleared and mapped for it, another process reads the rows back byte for
// byte, and the chunk's pages past them read as zero.
TEST(PutBatchTest, ALargeRowPutAloneGoesIntoPagesNobodyCleared) {
  TestServer server;  // its shm dir lies in /dev/shm
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = Open(server, session, 0);
  const size_t row_bytes = 600 << 10, n = 4;  // the first 4 MB chunk holds them
  for (size_t i = 0; i < n; ++i) {
    std::vector<uint8_t> bytes = Pattern(i, kSalt, row_bytes);
    const int64_t shape = static_cast<int64_t>(row_bytes);
    const ColumnRef col{"data", DType::kUInt8, std::span(&shape, 1), bytes.data(),
                        bytes.size()};
    bool inserted = false;
    Status s = cache->Put(i, std::span(&col, 1), &inserted);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
    EXPECT_TRUE(inserted) << i;
  }
  EXPECT_EQ(CheckRowsInChild(server, session, std::vector<bool>(n, true), row_bytes), 0);
  EXPECT_EQ(ChunksUnclearedPastTheirRows(server), 1);
}

TEST(PutBatchTest, FullPartWayKeepsWhatWasStoredAndSaysSoPerRow) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = Open(server, session, 1);
  const size_t n = (3u << 20) / kRowBytes;  // three times the 1 MB budget
  Batch b;
  for (size_t i = 0; i < n; ++i) b.AddPattern(i);
  ASSERT_TRUE(b.Put(cache.get()).ok());
  size_t stored = 0;
  while (stored < n && b.statuses[stored].ok()) ++stored;
  ASSERT_GT(stored, 0u);
  ASSERT_LT(stored, n);
  std::vector<bool> want(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (i < stored) {
      EXPECT_TRUE(b.inserted[i]) << i;
      want[i] = true;
    } else {
      EXPECT_TRUE(b.statuses[i].IsFull()) << i << ": " << b.statuses[i].ToString();
      EXPECT_FALSE(b.inserted[i]) << i;
    }
  }
  EXPECT_TRUE(cache->IsFull());
  EXPECT_EQ(CheckRowsInChild(server, session, want), 0);
}

TEST(PutBatchTest, TooLargeOrMalformedRowIsRefusedAlone) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = Open(server, session, 8);
  Batch b;
  b.AddPattern(0);
  b.Add(1, std::vector<uint8_t>(12u << 20, 1));  // more than the 8 MB budget
  b.AddPattern(2);
  b.AddPattern(3);
  b.AddPattern(4);
  b.Malform(3);
  ASSERT_TRUE(b.Put(cache.get()).ok());
  EXPECT_TRUE(b.statuses[0].ok()) << b.statuses[0].ToString();
  EXPECT_TRUE(b.statuses[1].IsTooLarge()) << b.statuses[1].ToString();
  EXPECT_TRUE(b.statuses[2].ok()) << b.statuses[2].ToString();
  EXPECT_TRUE(b.statuses[3].IsInvalidArgument()) << b.statuses[3].ToString();
  EXPECT_TRUE(b.statuses[4].ok()) << b.statuses[4].ToString();
  EXPECT_FALSE(cache->IsFull());
  EXPECT_EQ(CheckRowsInChild(server, session, {true, false, true, false, true}), 0);
}

TEST(PutBatchTest, DuplicateIdsInOneBatchFirstWins) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = Open(server, session, 0);
  Batch b;
  b.AddPattern(0);
  b.Add(0, std::vector<uint8_t>(kRowBytes, 0xEE));  // same id, other bytes
  b.AddPattern(1);
  b.Add(1, std::vector<uint8_t>(kRowBytes, 0xEE));
  ASSERT_TRUE(b.Put(cache.get()).ok());
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_TRUE(b.statuses[i].ok()) << i << ": " << b.statuses[i].ToString();
    EXPECT_EQ(b.inserted[i], i % 2 == 0) << i;
  }
  EXPECT_EQ(CheckRowsInChild(server, session, {true, true}), 0);
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, 2u);
}

TEST(PutBatchTest, ClosedCacheFailsEveryRow) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  auto cache = Open(server, server.NewSession(), 0);
  cache->Close();
  Batch b;
  b.AddPattern(0);
  b.AddPattern(1);
  Status s = b.Put(cache.get());
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(b.statuses[0], s);
  EXPECT_EQ(b.statuses[1], s);
  EXPECT_FALSE(b.inserted[0]);
}

// A trainer whose shell limits the size of the files it writes (ulimit -f,
// RLIMIT_FSIZE) never writes a segment file past that size: a batch's rows
// went into the segment through its descriptor, and a write at an offset
// past the limit is SIGXFSZ, whose default action killed the process (one
// that ignores it, as CPython does, got EFBIG and wrote through the
// mapping). The rows go through the mapping instead, which no such limit
// bounds. The puts run in a child, whose exit status shows the signal.
TEST(PutBatchTest, AFileSizeLimitNeitherKillsTheWriterNorLosesItsRows) {
  TestServer server;  // its shm dir lies in /dev/shm: rows through the descriptor
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  const size_t n = 64;
  pid_t pid = ForkChild([&]() -> int {
    // Below the first chunk's offset in its segment (its header's page).
    const rlimit limit{layout::kSegmentHeaderSize, layout::kSegmentHeaderSize};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) return 3;
    signal(SIGXFSZ, SIG_DFL);
    std::unique_ptr<Cache> cache = OpenCacheInChild(server, session, 0, false, "batch");
    if (cache == nullptr) return 4;
    Batch b;
    for (size_t i = 0; i < n; ++i) b.AddPattern(i);
    if (!b.Put(cache.get()).ok()) return 6;
    for (size_t i = 0; i < n; ++i) {
      if (!b.statuses[i].ok() || !b.inserted[i]) return 7;
    }
    return 0;
  });
  EXPECT_EQ(WaitChild(pid), 0) << "-" << SIGXFSZ << " is SIGXFSZ";
  EXPECT_EQ(CheckRowsInChild(server, session, std::vector<bool>(n, true)), 0);
}

// The descriptors of this process's segment files (the writer keeps one
// per segment it writes rows through).
std::vector<int> SegmentDescriptors(const TestServer& server) {
  std::vector<int> fds;
  const std::string prefix = server.shm_dir() + "/";
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code err;
    const std::string target = std::filesystem::read_symlink(e.path(), err).string();
    if (!err && target.starts_with(prefix) && target.find("seg.") != std::string::npos) {
      fds.push_back(std::stoi(e.path().filename().string()));
    }
  }
  return fds;
}

// The writer keeps each segment's descriptor for a batch's rows. Other code
// of the process that closes descriptors not its own (a "close every fd"
// loop) and opens a file that gets the number wrote the rows into that
// file and published them over pages nobody wrote: readers met rows that
// were not there, and the file got cache rows. The writer checks that the
// number still names the segment, else it writes through the mapping; and
// the cache's close leaves the number, which is not its own any more, open.
TEST(PutBatchTest, ASegmentDescriptorClosedAndReusedByOtherCodeIsNotWrittenThrough) {
  TestServer server;  // its shm dir lies in /dev/shm: rows through the descriptor
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  auto cache = Open(server, session, 0);
  const size_t n = 64;
  Batch first;
  for (size_t i = 0; i < n / 2; ++i) first.AddPattern(i);
  ASSERT_TRUE(first.Put(cache.get()).ok());
  const std::vector<int> fds = SegmentDescriptors(server);
  ASSERT_EQ(fds.size(), 1u) << "the writer keeps the segment's descriptor";
  TempDir tmp(TestTmpRoot());
  const std::string& dir = tmp.path();
  const std::string other = dir + "/other";
  const int fd = open(other.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(dup2(fd, fds[0]), fds[0]);  // closes the segment's, takes its number
  close(fd);
  Batch second;
  for (size_t i = n / 2; i < n; ++i) second.AddPattern(i);
  ASSERT_TRUE(second.Put(cache.get()).ok());
  for (size_t i = 0; i < second.size(); ++i) {
    EXPECT_TRUE(second.statuses[i].ok()) << i << ": " << second.statuses[i].ToString();
    EXPECT_TRUE(second.inserted[i]) << i;
  }
  EXPECT_EQ(CheckRowsInChild(server, session, std::vector<bool>(n, true)), 0);
  struct stat st;
  ASSERT_EQ(fstat(fds[0], &st), 0);
  EXPECT_EQ(st.st_size, 0) << "rows were written into another file";
  cache.reset();
  EXPECT_EQ(fstat(fds[0], &st), 0) << "the cache closed a descriptor not its own";
  close(fds[0]);
}

// Fills the file system of `dir` (a small tmpfs) with one file: the next
// file anyone creates there, or grows, gets no room.
void FillFileSystem(const std::string& dir) {
  const int fd = open((dir + "/filler").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  off_t end = 0;
  for (off_t step : {off_t{1} << 20, off_t{4096}}) {
    while (posix_fallocate(fd, end, step) == 0) end += step;
  }
  close(fd);
  ASSERT_GT(end, 0);
}

// A batch's rows are queued and then published in order; when the index
// cannot grow for one of them (here the shm dir has no room for the larger
// table; the server's cap is met the same way), the batch ends there: the
// rows published before it read back whole from another process, the row
// and every later one are Full with the reason and absent (their bytes were
// written, never published), and once there is room again they are stored
// over the room the unpublished ones gave back.
TEST(PutBatchTest, AnIndexThatCannotGrowMidWindowEndsTheBatchWhereItStood) {
  TmpfsMount shm("24m");
  if (!shm.mounted()) GTEST_SKIP() << shm.skip_reason();
  ServerOptions o;
  o.shm_dir = shm.path();
  TestServer server(o);
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  uint32_t session = server.NewSession();
  // A 4 MB budget: one segment, supplied whole when made, and a first
  // index table of 4,096 slots, full at 3,072 rows.
  auto cache = Open(server, session, 4);
  constexpr size_t kSmall = 8;  // rows of about 64 bytes: one chunk holds them all
  const size_t n = 4000;
  Batch first;
  first.AddPattern(0, kSmall);
  first.AddPattern(1, kSmall);
  ASSERT_TRUE(first.Put(cache.get()).ok());
  ASSERT_TRUE(first.statuses[0].ok() && first.statuses[1].ok());
  FillFileSystem(shm.path());

  Batch rest;
  for (size_t i = 2; i < n; ++i) rest.AddPattern(i, kSmall);
  ASSERT_TRUE(rest.Put(cache.get()).ok());
  size_t stored = 0;
  while (stored < rest.size() && rest.statuses[stored].ok()) ++stored;
  ASSERT_GT(stored, 0u);
  ASSERT_LT(stored, rest.size()) << "the index grew on a full file system";
  EXPECT_NE(stored % 32, 0u) << "ended at a window's start: not a queued row";
  for (size_t i = 0; i < rest.size(); ++i) {
    if (i < stored) {
      EXPECT_TRUE(rest.inserted[i]) << i;
      continue;
    }
    EXPECT_TRUE(rest.statuses[i].IsFull()) << i << ": " << rest.statuses[i].ToString();
    EXPECT_EQ(rest.statuses[i], rest.statuses[stored]) << i;
    EXPECT_FALSE(rest.inserted[i]) << i;
  }
  EXPECT_NE(rest.statuses[stored].message().find(shm.path()), std::string::npos)
      << "the reason names the shm dir: " << rest.statuses[stored].ToString();
  std::vector<bool> want(n, false);
  std::fill(want.begin(), want.begin() + static_cast<long>(2 + stored), true);
  EXPECT_EQ(CheckRowsInChild(server, session, want, kSmall), 0);

  // Room again: the rows not stored go into the room they gave back.
  ASSERT_EQ(unlink((shm.path() + "/filler").c_str()), 0);
  Batch again;
  for (size_t i = 2 + stored; i < n; ++i) again.AddPattern(i, kSmall);
  ASSERT_TRUE(again.Put(cache.get()).ok());
  for (size_t i = 0; i < again.size(); ++i) {
    EXPECT_TRUE(again.statuses[i].ok()) << i << ": " << again.statuses[i].ToString();
    EXPECT_TRUE(again.inserted[i]) << i;
  }
  EXPECT_EQ(CheckRowsInChild(server, session, std::vector<bool>(n, true), kSmall), 0);
}

// Rows of `n` ids (i, i + step, ...) from `first` put by PutBatch of
// `batch` into `cache` until one is Full; stored[id] set for each row
// stored. 0, or why it stopped otherwise.
int PutStridedBatches(Cache* cache, size_t first, size_t step, size_t n, size_t batch,
                      std::atomic<uint8_t>* stored) {
  for (size_t base = first; base < n; base += step * batch) {
    Batch b;
    for (size_t id = base; id < n && id < base + step * batch; id += step)
      b.AddPattern(id);
    if (!b.Put(cache).ok()) return 10;
    for (size_t i = 0; i < b.size(); ++i) {
      if (b.statuses[i].IsFull()) return 0;
      if (!b.statuses[i].ok() || !b.inserted[i]) return 11;
      stored[base + i * step].store(1);
    }
  }
  return 0;
}

// Batches of several writers on a budget smaller than their chunks: once
// it is used up, a writer's lease takes the end of the room another one's
// chunk holds past its rows (layout::kRoomTaken) while that one has rows
// queued for its next pwritev, which lie before the mark the take reads.
// Every row a writer was told it stored reads back whole from another
// process, no other row is there, and the writers together store about
// what one process stores.
TEST(PutBatchTest, BatchWritersTakingEachOthersRoomStoreEveryRowWhole) {
  TestServer server;
  ASSERT_TRUE(server.ok()) << server.start_result().Describe();
  constexpr size_t kWriters = 8;
  const size_t n = (5u << 20) / 4 / kRowBytes;  // 1.25 times the 1 MB budget
  auto* stored = static_cast<std::atomic<uint8_t>*>(
      mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(stored, MAP_FAILED);
  size_t alone = 0;
  {
    auto cache = Open(server, server.NewSession(), 1);
    ASSERT_EQ(PutStridedBatches(cache.get(), 0, 1, n, 16, stored), 0);
    for (size_t i = 0; i < n; ++i) alone += stored[i].exchange(0);
  }
  ASSERT_GT(alone, n / 2);
  const uint32_t session = server.NewSession();
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> writers;
  for (size_t k = 0; k < kWriters; ++k) {
    writers.push_back(ForkChild([&]() -> int {
      close(go[1]);
      std::unique_ptr<Cache> cache = OpenCacheInChild(server, session, 1, false, "batch");
      if (cache == nullptr) return 3;
      char b;
      if (read(go[0], &b, 1) != 0) return 5;  // all start at once
      return PutStridedBatches(cache.get(), k, kWriters, n, 8, stored);
    }));
  }
  close(go[0]);
  close(go[1]);
  for (pid_t pid : writers) EXPECT_EQ(WaitChild(pid), 0);
  std::vector<bool> want(n);
  size_t together = 0;
  for (size_t i = 0; i < n; ++i) together += (want[i] = stored[i].load() != 0);
  munmap(stored, n);
  EXPECT_EQ(CheckRowsInChild(server, session, want), 0);
  EXPECT_GE(together, alone * 9 / 10) << "of " << n << "; one process stores " << alone;
}

// Writers map leased chunks by reading them (PopulateForWrite): that must
// never touch a page the full tmpfs could not give, which would be a SIGBUS.
// The puts run in a child so that a SIGBUS shows as its exit status.
TEST(PutBatchTest, MappingChunksOnAFullTmpfsIsFullNotSigbus) {
  TmpfsMount tmpfs("16m,mode=0700");
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.skip_reason();
  const std::string& shm = tmpfs.path();
  {
    ServerOptions o;
    o.shm_dir = shm;
    TestServer server(o);
    ASSERT_TRUE(server.ok()) << server.start_result().Describe();
    uint32_t session = server.NewSession();
    const size_t n = (48u << 20) / kRowBytes;  // three times the tmpfs
    pid_t pid = ForkChild([&]() -> int {
      std::unique_ptr<Cache> cache = OpenCacheInChild(server, session, 0, false, "batch");
      if (cache == nullptr) return 3;
      std::vector<uint8_t> row(kRowBytes);
      bool full = false;
      for (size_t i = 0; i < n / 2; ++i) {  // one row at a time, then batches
        FillPattern(i, kSalt, row.data(), row.size());
        Status s = cache->Put(i, row.data(), row.size());
        if (s.IsFull()) full = true;
        else if (!s.ok()) return 5;
      }
      for (size_t base = n / 2; base < n; base += 256) {
        Batch b;
        for (size_t i = base; i < std::min(n, base + 256); ++i) b.AddPattern(i);
        if (!b.Put(cache.get()).ok()) return 6;
        for (size_t i = 0; i < b.size(); ++i) {
          if (b.statuses[i].IsFull()) full = true;
          else if (!b.statuses[i].ok()) return 7;
        }
      }
      return full ? 0 : 8;
    });
    EXPECT_EQ(WaitChild(pid), 0) << "-" << SIGBUS << " would be a SIGBUS";
    // What was stored before the tmpfs filled reads back whole.
    auto cache = Open(server, session, 0);
    CacheStats st;
    ASSERT_TRUE(cache->GetStats(&st).ok());
    EXPECT_GT(st.mem_rows, 0u);
    std::vector<bool> want(n, false);
    for (size_t i = 0; i < n; ++i) want[i] = cache->Contains(i);
    EXPECT_EQ(CheckRowsInChild(server, session, want), 0);
  }
}

}  // namespace
}  // namespace shmcache::test
