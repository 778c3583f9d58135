// End to end: a real daemon per test (started and stopped through the admin
// binary), clients in this process and in forked processes.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "child_process.h"
#include "layout.h"
#include "shm_file.h"
#include "shmcache/client.h"
#include "test_server.h"

namespace shmcache::test {
namespace {

constexpr size_t kRowBytes = 3072;

CacheOptions Options(uint32_t session, const std::string& name = "train",
                     uint64_t size_mb = 0) {
  CacheOptions o;
  o.session_id = session;
  o.name = name;
  o.fingerprint = name + "-pipeline";
  o.size_mb = size_mb;
  return o;
}

// Row size varies with the id, so rows straddle chunk ends.
size_t RowBytes(uint64_t id) { return 64 + (id * 131) % (2 * kRowBytes); }

// Checks a copied row against the pattern; returns false (with a message
// on stderr) on any difference. Usable in children.
bool RowMatches(const Row& row, uint64_t id, uint64_t salt, size_t n,
                bool quiet = false) {
  if (row.num_columns() != 1) {
    if (!quiet) fprintf(stderr, "row %lu: %zu columns\n", id, row.num_columns());
    return false;
  }
  ColumnView c = row.column(0);
  std::vector<uint8_t> want = Pattern(id, salt, n);
  if (c.nbytes != n || c.name != "data" || std::memcmp(c.data, want.data(), n) != 0) {
    if (!quiet) fprintf(stderr, "row %lu: bytes differ (%zu vs %zu)\n", id, c.nbytes, n);
    return false;
  }
  return true;
}

Status PutPattern(Cache& cache, uint64_t id, uint64_t salt, size_t n,
                  bool* inserted = nullptr) {
  std::vector<uint8_t> v = Pattern(id, salt, n);
  return cache.Put(id, v.data(), v.size(), inserted);
}

class IntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TestServer>();
    ASSERT_TRUE(server_->ok());
    session_ = server_->NewSession();
    ASSERT_NE(session_, 0u);
  }
  void TearDown() override { server_.reset(); }

  std::unique_ptr<Cache> Open(Client& client, const CacheOptions& o) {
    std::unique_ptr<Cache> cache;
    Status s = client.OpenCache(o, &cache);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return cache;
  }
  // A client and a cache of this test's session, for this process.
  void Attach(std::unique_ptr<Client>* client, std::unique_ptr<Cache>* cache,
              const std::string& name = "train", uint64_t size_mb = 0) {
    Status s = server_->Connect(client);
    ASSERT_TRUE(s.ok()) << s.ToString();
    *cache = Open(**client, Options(session_, name, size_mb));
    ASSERT_TRUE(*cache);
  }

  std::unique_ptr<TestServer> server_;
  uint32_t session_ = 0;
};

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

TEST_F(IntegrationTest, OpeningWithAnotherFingerprintIsRefused) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  CacheOptions o = Options(session_);
  o.fingerprint = "another-pipeline";
  std::unique_ptr<Cache> other;
  Status s = client->OpenCache(o, &other);
  EXPECT_TRUE(s.IsFingerprintMismatch()) << s.ToString();
  // The same name and fingerprint is the same cache.
  std::unique_ptr<Cache> same = Open(*client, Options(session_));
  ASSERT_TRUE(same);
  EXPECT_EQ(same->cache_id(), cache->cache_id());
  // A session that does not exist is NotFound, naming it.
  s = client->OpenCache(Options(session_ + 1), &other);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_NE(s.message().find(std::to_string(session_ + 1)), std::string::npos);
}

// Names show up in listings and as Python str: the library refuses a name
// or fingerprint that is not UTF-8 itself, without asking the daemon (here
// gone, so asking would fail with Unavailable instead).
TEST_F(IntegrationTest, OpeningANameThatIsNotUtf8IsRefusedByTheLibrary) {
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server_->Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(Options(session_, "caf\xc3\xa9"), &cache);
  ASSERT_TRUE(s.ok()) << s.ToString();
  server_->Kill();
  for (std::string bad : {"\xff\xfe", "train\xe2\x82", "\xf4\x90\x80\x80"}) {
    std::unique_ptr<Cache> other;
    s = client->OpenCache(Options(session_, bad), &other);
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    EXPECT_NE(s.message().find("UTF-8"), std::string::npos) << s.message();
  }
  CacheOptions o = Options(session_);
  o.fingerprint = "pipeline-\x80";
  std::unique_ptr<Cache> other;
  EXPECT_TRUE(client->OpenCache(o, &other).IsInvalidArgument());
}

// Several processes put and get the same rows at once; every byte of every
// row read anywhere is checked, and the cache ends up with each row once.
TEST_F(IntegrationTest, ForkedProcessesShareOneCache) {
  constexpr int kProcs = 4;
  constexpr uint64_t kRows = 3000;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    kids.push_back(ForkChild([&, p]() -> int {
      std::unique_ptr<Client> client;
      if (!server_->Connect(&client).ok()) return 2;
      std::unique_ptr<Cache> cache;
      Status s = client->OpenCache(Options(session_), &cache);
      if (!s.ok()) return 3;
      Row row;
      // Each process walks all ids from its own starting point: misses are
      // loaded "from the source" and put, hits are verified.
      for (uint64_t i = 0; i < kRows; ++i) {
        uint64_t id = (i + p * kRows / kProcs) % kRows;
        s = cache->Get(id, &row);
        if (s.ok()) {
          if (!RowMatches(row, id, 0, RowBytes(id))) return 4;
        } else if (s.IsNotFound()) {
          if (!PutPattern(*cache, id, 0, RowBytes(id)).ok()) return 5;
        } else {
          fprintf(stderr, "get %lu: %s\n", id, s.ToString().c_str());
          return 6;
        }
      }
      // Second epoch: everything is a hit, byte for byte.
      for (uint64_t id = 0; id < kRows; ++id) {
        if (!cache->Get(id, &row).ok() || !RowMatches(row, id, 0, RowBytes(id))) return 7;
        RowView v;
        if (!cache->View(id, &v).ok() || v.column(0).nbytes != RowBytes(id)) return 8;
      }
      return 0;
    }));
  }
  for (pid_t k : kids) EXPECT_EQ(WaitChild(k), 0);
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  Row row;
  for (uint64_t id = 0; id < kRows; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
    ASSERT_TRUE(RowMatches(row, id, 0, RowBytes(id)));
  }
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_GE(st.mem_rows, kRows);
  EXPECT_LE(st.mem_rows, kRows + kRows / 20) << "rows are held once, not per process";
  EXPECT_GE(st.hits, kRows * kProcs * 2);
}

// Reads are counted by one thread in a lane of its own (plain stores) and
// by every other thread with atomic adds: each read is counted once,
// whichever way, with threads of one process and a forked child (whose
// parent's lane is not its own) reading at once.
TEST_F(IntegrationTest, ReadsOfThreadsAndAForkedChildAreEachCountedOnce) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  constexpr uint64_t kRows = 64, kReads = 20000, kThreads = 3;
  for (uint64_t id = 0; id < kRows; ++id) {
    ASSERT_TRUE(PutPattern(*cache, id, 0, RowBytes(id)).ok());
  }
  // Each reader: kReads hits (Get and View alternately) and kReads / 4
  // misses (ids past the rows).
  auto read = [&] {
    Row row;
    RowView view;
    bool ok = true;
    for (uint64_t i = 0; i < kReads; ++i) {
      ok &= (i % 2 ? cache->Get(i % kRows, &row) : cache->View(i % kRows, &view)).ok();
      if (i % 4 == 0) ok &= cache->Get(kRows + i, &row).IsNotFound();
    }
    return ok;
  };
  ASSERT_TRUE(read());  // this thread takes the lane
  pid_t kid = ForkChild([&] { return read() ? 0 : 1; });
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] { failed += read() ? 0 : 1; });
  }
  bool main_ok = read();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(WaitChild(kid), 0);
  EXPECT_TRUE(main_ok);
  EXPECT_EQ(failed.load(), 0);
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  const uint64_t readers = 1 + 1 + kThreads + 1;  // first read, child, threads, second
  EXPECT_EQ(st.hits, readers * kReads);
  EXPECT_EQ(st.misses, readers * kReads / 4);
}

TEST_F(IntegrationTest, ThreadsOfOneProcessShareOneCache) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  constexpr uint64_t kRows = 4000;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Row row;
      for (uint64_t i = 0; i < kRows; ++i) {
        uint64_t id = (i * 7 + t * 1000) % kRows;
        Status s = cache->Get(id, &row);
        if (s.ok()) {
          if (!RowMatches(row, id, 0, RowBytes(id))) bad++;
        } else if (!s.IsNotFound() || !PutPattern(*cache, id, 0, RowBytes(id)).ok()) {
          bad++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  Row row;
  for (uint64_t id = 0; id < kRows; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok());
    ASSERT_TRUE(RowMatches(row, id, 0, RowBytes(id)));
  }
}

TEST_F(IntegrationTest, ChildForkedAfterOpenKeepsWorking) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  for (uint64_t id = 0; id < 100; ++id) {
    ASSERT_TRUE(PutPattern(*cache, id, 0, kRowBytes).ok());
  }
  pid_t kid = ForkChild([&]() -> int {
    Row row;
    for (uint64_t id = 0; id < 100; ++id) {  // the parent's rows
      if (!cache->Get(id, &row).ok() || !RowMatches(row, id, 0, kRowBytes)) return 2;
    }
    for (uint64_t id = 100; id < 1600; ++id) {  // enough for new chunks
      Status s = PutPattern(*cache, id, 0, kRowBytes);
      if (!s.ok()) {
        fprintf(stderr, "child put %lu: %s\n", id, s.ToString().c_str());
        return 3;
      }
    }
    for (uint64_t id = 0; id < 1600; ++id) {
      if (!cache->Get(id, &row).ok() || !RowMatches(row, id, 0, kRowBytes)) return 4;
    }
    uint32_t s2 = 0;  // control calls work too (a fresh connection)
    if (!client->CreateSession(&s2).ok() || !client->CheckSession(s2).ok()) return 5;
    return 0;
  });
  ASSERT_EQ(WaitChild(kid), 0);
  // The parent sees the child's rows and goes on writing in its own chunk.
  Row row;
  for (uint64_t id = 0; id < 1600; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
    ASSERT_TRUE(RowMatches(row, id, 0, kRowBytes));
  }
  for (uint64_t id = 1600; id < 1700; ++id) {
    ASSERT_TRUE(PutPattern(*cache, id, 0, kRowBytes).ok());
  }
  for (uint64_t id = 0; id < 1700; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok());
    ASSERT_TRUE(RowMatches(row, id, 0, kRowBytes)) << id;
  }
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, 1700u);
}

TEST_F(IntegrationTest, SessionsPersistBetweenClientRuns) {
  {
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    Attach(&client, &cache);
    for (uint64_t id = 0; id < 500; ++id) {
      ASSERT_TRUE(PutPattern(*cache, id, 0, kRowBytes).ok());
    }
  }  // disconnects
  // Another run, in another process.
  pid_t kid = ForkChild([&]() -> int {
    std::unique_ptr<Client> client;
    if (!server_->Connect(&client).ok()) return 2;
    if (!client->CheckSession(session_).ok()) return 3;
    std::unique_ptr<Cache> cache;
    if (!client->OpenCache(Options(session_), &cache).ok()) return 4;
    Row row;
    for (uint64_t id = 0; id < 500; ++id) {
      if (!cache->Get(id, &row).ok() || !RowMatches(row, id, 0, kRowBytes)) return 5;
    }
    for (uint64_t id = 500; id < 600; ++id) {
      if (!PutPattern(*cache, id, 0, kRowBytes).ok()) return 6;
    }
    return 0;
  });
  ASSERT_EQ(WaitChild(kid), 0);
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  Row row;
  for (uint64_t id = 0; id < 600; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
    ASSERT_TRUE(RowMatches(row, id, 0, kRowBytes));
  }
  std::vector<SessionInfo> sessions;
  ASSERT_TRUE(client->ListSessions(&sessions).ok());
  ASSERT_EQ(sessions.size(), 1u);
  ASSERT_EQ(sessions[0].caches.size(), 1u);
  EXPECT_EQ(sessions[0].caches[0].mem_rows, 600u);
}

TEST_F(IntegrationTest, DestroyFreesTheMemory) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  uint32_t keep = 0;
  ASSERT_TRUE(client->CreateSession(&keep).ok());
  std::unique_ptr<Cache> kept = Open(*client, Options(keep, "kept"));
  ASSERT_TRUE(kept);
  ASSERT_TRUE(PutPattern(*kept, 1, 0, kRowBytes).ok());
  for (uint64_t id = 0; id < 3000; ++id) {
    ASSERT_TRUE(PutPattern(*cache, id, 0, kRowBytes).ok());
  }
  RowView view;
  ASSERT_TRUE(cache->View(5, &view).ok());
  auto files_of = [&](uint32_t cache_id) {
    std::vector<std::string> out;
    for (const std::string& f : server_->ShmFiles()) {
      std::string rest = f.substr(server_->shm_prefix().size());
      for (const char* kind : {"cache.", "table.", "seg."}) {
        std::string p = std::string(kind) + std::to_string(cache_id);
        if (rest == p || rest.rfind(p + ".", 0) == 0) out.push_back(f);
      }
    }
    return out;
  };
  EXPECT_GE(files_of(cache->cache_id()).size(), 3u);  // header, table, segments
  ServerInfo before, after;
  ASSERT_TRUE(client->GetServerInfo(&before).ok());

  ASSERT_TRUE(client->DestroySession(session_).ok());
  EXPECT_TRUE(files_of(cache->cache_id()).empty())
      << testing::PrintToString(files_of(cache->cache_id()));
  ASSERT_TRUE(client->GetServerInfo(&after).ok());
  // This process still maps the cache: tmpfs keeps those pages, and the cap
  // counts them (held) until the Cache is closed.
  EXPECT_GT(after.memory_held_bytes, 4u << 20);
  EXPECT_LE(after.memory_used_bytes, before.memory_used_bytes);
  EXPECT_EQ(after.sessions, std::vector<uint32_t>{keep});
  // The open cache says so instead of crashing; a view taken before stays
  // readable (the mapping lives until the Cache is closed).
  Row row;
  EXPECT_TRUE(cache->Get(5, &row).IsNotFound());
  EXPECT_TRUE(PutPattern(*cache, 9999, 0, 10).IsNotFound());
  EXPECT_EQ(std::memcmp(view.column(0).data, Pattern(5, 0, kRowBytes).data(), kRowBytes),
            0);
  EXPECT_TRUE(client->CheckSession(session_).IsNotFound());
  EXPECT_TRUE(client->DestroySession(session_).IsNotFound());
  // Other sessions are untouched.
  ASSERT_TRUE(kept->Get(1, &row).ok());
  EXPECT_TRUE(RowMatches(row, 1, 0, kRowBytes));
  EXPECT_FALSE(files_of(kept->cache_id()).empty());
  cache.reset();  // unmaps: the memory is really free now
  EXPECT_TRUE(WaitFor([&] {
    return client->GetServerInfo(&after).ok() && after.memory_held_bytes == 0;
  }));
  EXPECT_LT(after.memory_used_bytes + 4 * (1 << 20), before.memory_used_bytes);
}

TEST_F(IntegrationTest, StopRemovesTheSocketAndEverySegment) {
  {
    std::unique_ptr<Client> client;
    std::unique_ptr<Cache> cache;
    Attach(&client, &cache);
    for (uint64_t id = 0; id < 2000; ++id) {
      ASSERT_TRUE(PutPattern(*cache, id, 0, kRowBytes).ok());
    }
    std::unique_ptr<Cache> second = Open(*client, Options(session_, "eval"));
    ASSERT_TRUE(PutPattern(*second, 1, 0, kRowBytes).ok());
  }
  EXPECT_GE(server_->ShmFiles().size(), 6u);
  ASSERT_TRUE(PathExists(server_->socket_path()));
  CommandResult r = server_->Stop();
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(server_->ShmFiles().empty()) << testing::PrintToString(server_->ShmFiles());
  EXPECT_FALSE(PathExists(server_->socket_path()));
  EXPECT_TRUE(ListDir(server_->shm_dir()).empty());
}

TEST_F(IntegrationTest, FirstWriterWinsInOneProcess) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  bool inserted = false;
  ASSERT_TRUE(PutPattern(*cache, 7, /*salt=*/1, kRowBytes, &inserted).ok());
  EXPECT_TRUE(inserted);
  ASSERT_TRUE(PutPattern(*cache, 7, /*salt=*/2, kRowBytes / 2, &inserted).ok());
  EXPECT_FALSE(inserted) << "the second copy is dropped without error";
  Row row;
  ASSERT_TRUE(cache->Get(7, &row).ok());
  EXPECT_TRUE(RowMatches(row, 7, 1, kRowBytes));
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_EQ(st.mem_rows, 1u);
}

// Processes race to put the same ids with different contents. Every reader
// agrees on one whole copy per id, one of the written ones.
TEST_F(IntegrationTest, FirstWriterWinsAcrossProcesses) {
  constexpr int kProcs = 4;
  constexpr uint64_t kRows = 1500;
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    kids.push_back(ForkChild([&, p]() -> int {
      close(ready[0]);
      close(go[1]);
      std::unique_ptr<Client> client;
      if (!server_->Connect(&client).ok()) return 2;
      std::unique_ptr<Cache> cache;
      if (!client->OpenCache(Options(session_), &cache).ok()) return 3;
      char c = 'r';
      if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 0) return 4;
      for (uint64_t id = 0; id < kRows; ++id) {
        if (!PutPattern(*cache, id, /*salt=*/p + 1, kRowBytes).ok()) return 5;
      }
      return 0;
    }));
  }
  close(ready[1]);
  close(go[0]);
  char c;
  for (int p = 0; p < kProcs; ++p) ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(go[1]);  // EOF releases every child at once
  for (pid_t k : kids) EXPECT_EQ(WaitChild(k), 0);
  close(ready[0]);

  std::vector<int> winner(kRows, -1);
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  Row row;
  for (uint64_t id = 0; id < kRows; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok());
    for (int p = 0; p < kProcs; ++p) {
      if (RowMatches(row, id, p + 1, kRowBytes, true)) winner[id] = p;
    }
    ASSERT_NE(winner[id], -1) << "row " << id << " is nobody's whole copy";
  }
  // Other processes read the same winners.
  pid_t kid = ForkChild([&]() -> int {
    std::unique_ptr<Client> c2;
    if (!server_->Connect(&c2).ok()) return 2;
    std::unique_ptr<Cache> k2;
    if (!c2->OpenCache(Options(session_), &k2).ok()) return 3;
    Row r;
    for (uint64_t id = 0; id < kRows; ++id) {
      if (!k2->Get(id, &r).ok() || !RowMatches(r, id, winner[id] + 1, kRowBytes))
        return 4;
    }
    return 0;
  });
  EXPECT_EQ(WaitChild(kid), 0);
}

TEST_F(IntegrationTest, ColumnProjection) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  std::vector<float> image(3 * 8 * 8);
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

// row.h's statement of a view's lifetime: a view of shared memory stays
// valid until its Cache is destroyed; Close() and the destruction of its
// session do not end it.
TEST_F(IntegrationTest, ViewOfSharedMemoryOutlivesCloseAndTheSession) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 0, 0, kRowBytes).ok());
  RowView view;
  ASSERT_TRUE(cache->View(0, &view).ok());
  ASSERT_TRUE(view.in_shared_memory());
  cache->Close();
  ASSERT_TRUE(client->DestroySession(session_).ok());
  ASSERT_EQ(view.column(0).nbytes, kRowBytes);
  EXPECT_EQ(std::memcmp(view.column(0).data, Pattern(0, 0, kRowBytes).data(), kRowBytes),
            0);
}

// A view points into shared memory and stays valid while the cache is open,
// whatever else is written (new chunks, new segments, a grown index).
TEST_F(IntegrationTest, ViewStaysValid) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache, "train", /*size_mb=*/64);
  ASSERT_TRUE(PutPattern(*cache, 0, 0, kRowBytes).ok());
  RowView view;
  ASSERT_TRUE(cache->View(0, &view).ok());
  const std::byte* where = view.column(0).data;
  // 64 MB budget: the first index table has 2^16 slots, so 60000 small rows
  // grow it, and the rows need several segments.
  CacheStats st0;
  ASSERT_TRUE(cache->GetStats(&st0).ok());
  std::vector<uint8_t> small(200);
  for (uint64_t id = 1; id < 60000; ++id) {
    FillPattern(id, 0, small.data(), small.size());
    ASSERT_TRUE(cache->Put(id, small.data(), small.size()).ok()) << id;
  }
  CacheStats st1;
  ASSERT_TRUE(cache->GetStats(&st1).ok());
  EXPECT_GT(st1.reserved_bytes, st0.reserved_bytes + (8 << 20));
  ASSERT_EQ(view.column(0).data, where);
  EXPECT_EQ(std::memcmp(view.column(0).data, Pattern(0, 0, kRowBytes).data(), kRowBytes),
            0);
  RowView again;
  ASSERT_TRUE(cache->View(0, &again).ok());
  EXPECT_EQ(again.column(0).data, where) << "zero-copy: the same bytes";
  Row row;
  for (uint64_t id = 1; id < 60000; id += 997) {
    ASSERT_TRUE(cache->Get(id, &row).ok());
    ASSERT_TRUE(RowMatches(row, id, 0, small.size()));
  }
}

// Views point into memory this process maps read-only: a write through
// one faults in the writer (even the process that put the row) and never
// reaches what others read.
TEST_F(IntegrationTest, AWriteThroughAViewFaultsAndChangesNothing) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 5, 0, kRowBytes).ok());
  RowView view;
  ASSERT_TRUE(cache->View(5, &view).ok());
  EXPECT_TRUE(view.in_shared_memory());
  Row row;
  ASSERT_TRUE(cache->Get(5, &row).ok());
  EXPECT_FALSE(row.view().in_shared_memory());
  pid_t pid = ForkChild([&] {
    auto* p = const_cast<std::byte*>(view.column(0).data);
    *reinterpret_cast<volatile std::byte*>(p) = std::byte{0x5a};
    return 0;  // not reached: the store faults
  });
  EXPECT_EQ(WaitChild(pid), -SIGSEGV);
  ASSERT_TRUE(cache->Get(5, &row).ok());
  EXPECT_TRUE(RowMatches(row, 5, 0, kRowBytes));
}

// The index grows (new tables) while other processes read: no reader ever
// misses a row that was published before it looked.
TEST_F(IntegrationTest, IndexGrowsUnderConcurrentReaders) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache, "grow", /*size_mb=*/4);  // smallest first table
  constexpr uint64_t kRows = 20000;
  std::vector<uint8_t> v(16);
  // Rows are published in id order; the count is shared with the readers.
  auto* published = static_cast<std::atomic<uint64_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(published, MAP_FAILED);
  new (published) std::atomic<uint64_t>(0);
  std::vector<pid_t> readers;
  for (int r = 0; r < 2; ++r) {
    readers.push_back(ForkChild([&, r]() -> int {
      std::unique_ptr<Client> c2;
      if (!server_->Connect(&c2).ok()) return 2;
      std::unique_ptr<Cache> k2;
      if (!c2->OpenCache(Options(session_, "grow", 4), &k2).ok()) return 3;
      Row row;
      uint64_t x = r + 1;
      for (;;) {
        uint64_t n = published->load(std::memory_order_acquire);
        if (n == 0) continue;
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        uint64_t id = (x >> 17) % n;
        if (!k2->Get(id, &row).ok()) {
          fprintf(stderr, "reader: row %lu of %lu missing\n", id, n);
          return 4;
        }
        if (!RowMatches(row, id, 0, 16)) return 5;
        if (n == kRows) return 0;
      }
    }));
  }
  for (uint64_t id = 0; id < kRows; ++id) {
    FillPattern(id, 0, v.data(), v.size());
    ASSERT_TRUE(cache->Put(id, v.data(), v.size()).ok()) << id;
    published->store(id + 1, std::memory_order_release);
  }
  for (pid_t k : readers) EXPECT_EQ(WaitChild(k), 0);
  munmap(published, 4096);
  size_t tables = 0;
  for (const std::string& f : server_->ShmFiles()) {
    tables +=
        f.find(".table." + std::to_string(cache->cache_id()) + ".") != std::string::npos;
  }
  EXPECT_GE(tables, 3u) << "the index grew";
}

TEST_F(IntegrationTest, FullCacheRefusesRowsAndKeepsServing) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache, "small", /*size_mb=*/8);
  Status s;
  uint64_t id = 0;
  for (; id < 10000; ++id) {
    s = PutPattern(*cache, id, 0, kRowBytes);
    if (!s.ok()) break;
  }
  ASSERT_TRUE(s.IsFull()) << s.ToString();
  EXPECT_TRUE(cache->IsFull());
  EXPECT_GT(id, 2000u) << "most of 8 MB holds 3 KB rows";
  Row row;
  for (uint64_t i = 0; i < id; ++i) {
    ASSERT_TRUE(cache->Get(i, &row).ok()) << i;
    ASSERT_TRUE(RowMatches(row, i, 0, kRowBytes));
  }
  EXPECT_TRUE(PutPattern(*cache, id + 1, 0, 10).IsFull());
  CacheStats st;
  ASSERT_TRUE(cache->GetStats(&st).ok());
  EXPECT_TRUE(st.full);
  EXPECT_LE(st.mem_bytes, st.budget_bytes);
}

// When the daemon is gone, calls fail with Unavailable instead of crashing
// or hanging; rows already mapped may still be served.
TEST_F(IntegrationTest, UnavailableWhenTheDaemonIsGone) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 1, 0, kRowBytes).ok());
  server_->Kill();
  uint32_t id = 0;
  Status s = client->CreateSession(&id);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  std::vector<SessionInfo> sessions;
  EXPECT_TRUE(client->ListSessions(&sessions).IsUnavailable());
  // Puts that need a new chunk cannot get one.
  std::vector<uint8_t> big(8 << 20);
  s = cache->Put(2, big.data(), big.size());
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  Row row;
  s = cache->Get(1, &row);
  EXPECT_TRUE(s.ok() || s.IsUnavailable() || s.IsNotFound()) << s.ToString();
  // A new client is told the server is not running.
  std::unique_ptr<Client> other;
  s = server_->Connect(&other);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("not running"), std::string::npos) << s.ToString();
  cache->Close();
}

// The demo: four shard_worker "devices" on one session at once.
// The host ends up holding each row once, and every hit was byte-exact.
TEST_F(IntegrationTest, FourShardWorkersHoldEachRowOnce) {
  const char* worker = std::getenv("SHMCACHE_SHARD_WORKER");
  ASSERT_NE(worker, nullptr);
  constexpr int kDevices = 4, kRows = 4000;
  std::vector<pid_t> kids;
  for (int d = 0; d < kDevices; ++d) {
    kids.push_back(ForkChild([&, d]() -> int {
      CommandResult r =
          RunCommand({worker, "--session_id", std::to_string(session_), "--device",
                      std::to_string(d), "--num_devices", std::to_string(kDevices),
                      "--rows", std::to_string(kRows), "--epochs", "2", "--port",
                      std::to_string(server_->port())},
                     server_->AdminEnv());
      if (r.exit_code != 0 || r.out.find(" 0 wrong rows") == std::string::npos) {
        fprintf(stderr, "%s\n", r.Describe().c_str());
        return 2;
      }
      return 0;
    }));
  }
  for (pid_t k : kids) EXPECT_EQ(WaitChild(k), 0);
  CommandResult list = server_->Admin({"--list_sessions", "--json"});
  ASSERT_EQ(list.exit_code, 0) << list.Describe();
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server_->Connect(&client).ok());
  std::vector<SessionInfo> sessions;
  ASSERT_TRUE(client->ListSessions(&sessions).ok());
  ASSERT_EQ(sessions.size(), 1u);
  ASSERT_EQ(sessions[0].caches.size(), 1u);
  const CacheStats& c = sessions[0].caches[0];
  // Each row once. Known gap (index_table.h): two writers racing on one id
  // may both publish, so a few rows can be held twice; readers still agree
  // on one copy. Bounded here, exact once the index claims with the key.
  EXPECT_GE(c.mem_rows, uint64_t{kRows});
  EXPECT_LE(c.mem_rows, uint64_t{kRows} + kRows / 100);
  EXPECT_GE(c.hits, uint64_t{kRows} * (kDevices - 1));  // epoch 2 reads all
  EXPECT_LE(c.mem_bytes, c.mem_rows * (3072 + 64));
}

// Only the owner may reach the daemon or map its memory.
TEST_F(IntegrationTest, SocketAndSharedMemoryAreOwnerOnly) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 1, 0, kRowBytes).ok());
  struct stat st;
  ASSERT_EQ(stat(server_->socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << std::oct << st.st_mode;
  EXPECT_EQ(st.st_uid, geteuid());
  ASSERT_EQ(stat(server_->run_dir().c_str(), &st), 0);
  for (const std::string& f : server_->ShmFiles()) {
    ASSERT_EQ(stat((server_->shm_dir() + "/" + f).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0077, 0u) << f << " mode " << std::oct << st.st_mode;
  }
}

// A segment whose header is damaged is refused when mapped: Corruption
// naming the file, never a crash.
TEST_F(IntegrationTest, DamagedSegmentHeaderIsRefused) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 1, 0, kRowBytes).ok());
  std::string seg = server_->shm_dir() + "/" + server_->shm_prefix() + "seg." +
                    std::to_string(cache->cache_id()) + ".0";
  ShmFile f;
  ASSERT_TRUE(ShmFile::Open(seg, &f).ok());
  auto* h = reinterpret_cast<layout::FileHeader*>(f.data());
  for (int field = 0; field < 2; ++field) {
    layout::FileHeader saved = *h;
    if (field == 0) h->magic ^= 1;
    if (field == 1) h->version = layout::kLayoutVersion + 1;
    pid_t kid = ForkChild([&]() -> int {  // a fresh process maps it anew
      std::unique_ptr<Client> c2;
      if (!server_->Connect(&c2).ok()) return 2;
      std::unique_ptr<Cache> k2;
      if (!c2->OpenCache(Options(session_), &k2).ok()) return 3;
      Row row;
      Status s = k2->Get(1, &row);
      if (!s.IsCorruption() || s.message().find(seg) == std::string::npos) {
        fprintf(stderr, "%s\n", s.ToString().c_str());
        return 4;
      }
      return 0;
    });
    EXPECT_EQ(WaitChild(kid), 0) << "field " << field;
    *h = saved;
  }
  Row row;
  ASSERT_TRUE(cache->Get(1, &row).ok());
  EXPECT_TRUE(RowMatches(row, 1, 0, kRowBytes));
}

TEST(ClientTest, ConnectWithoutADaemonIsUnavailable) {
  std::string run = MakeTempDir(TestTmpRoot(), "nodaemon");
  ClientOptions o;
  o.port = 30999;
  o.run_dir = run;
  std::unique_ptr<Client> client;
  Status s = Client::Connect(o, &client);
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("30999"), std::string::npos) << s.ToString();
  RemoveTree(run);
}

TEST(ClientTest, NonLocalHostAndBadPortAreInvalidArguments) {
  ClientOptions o;
  o.hostname = "10.1.2.3";
  std::unique_ptr<Client> client;
  Status s = Client::Connect(o, &client);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("10.1.2.3"), std::string::npos);
  ClientOptions p;
  p.port = 80;
  s = Client::Connect(p, &client);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("1025..65535"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace shmcache::test
