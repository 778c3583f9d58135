// The index grows (new tables, cache_state_index.cc) while other processes
// read through it (index_table.h): no reader misses a published row. A real
// daemon per test (integration_fixture.h).
#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/child_process.h"
#include "tests/support/integration_fixture.h"
#include "tests/support/row_pattern.h"

namespace shmcache::test {
namespace {

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
  constexpr int kReaders = 2;
  std::vector<pid_t> readers;
  readers.reserve(kReaders);
  for (int r = 0; r < kReaders; ++r) {
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
        if (Status s = k2->Get(id, &row); !s.ok()) {
          fprintf(stderr, "reader: row %lu of %lu missing: %s\n", id, n,
                  s.ToString().c_str());
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

// The daemon compacts the older tables into each new one while writers in
// two processes publish into them and readers in two others read batches
// (which probe the tables they saw when the call began, and fall back to
// nothing): no reader misses a row published before its call, and every
// row is found afterwards.
TEST_F(IntegrationTest, IndexCompactsUnderConcurrentWritersAndBatchReaders) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache, "compact", /*size_mb=*/4);  // smallest first table
  constexpr uint64_t kRows = 30000;                   // several growths past 4,096 slots
  constexpr int kWriters = 2;
  // published[w]: writer w has published its ids w, w + 2, ... below
  // published[w] * 2 + w.
  auto* published = static_cast<std::atomic<uint64_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(published, MAP_FAILED);
  for (int w = 0; w < kWriters; ++w) new (&published[w]) std::atomic<uint64_t>(0);
  auto open = [&](const char* who, std::unique_ptr<Client>* c,
                  std::unique_ptr<Cache>* k) {
    if (server_->Connect(c).ok() &&
        (*c)->OpenCache(Options(session_, "compact", 4), k).ok()) {
      return true;
    }
    fprintf(stderr, "%s: cannot open the cache\n", who);
    return false;
  };
  std::vector<pid_t> children;
  children.reserve(kWriters + 2);
  for (int w = 0; w < kWriters; ++w) {
    children.push_back(ForkChild([&, w]() -> int {
      std::unique_ptr<Client> c2;
      std::unique_ptr<Cache> k2;
      if (!open("writer", &c2, &k2)) return 2;
      std::vector<uint8_t> v(16);
      for (uint64_t n = 0; n * kWriters + w < kRows; ++n) {
        const uint64_t id = n * kWriters + w;
        FillPattern(id, 0, v.data(), v.size());
        if (!k2->Put(id, v.data(), v.size()).ok()) return 3;
        published[w].store(n + 1, std::memory_order_release);
      }
      return 0;
    }));
  }
  for (int r = 0; r < 2; ++r) {
    children.push_back(ForkChild([&, r]() -> int {
      std::unique_ptr<Client> c2;
      std::unique_ptr<Cache> k2;
      if (!open("reader", &c2, &k2)) return 2;
      constexpr size_t kBatch = 16;
      std::vector<uint64_t> ids(kBatch);
      std::vector<Row> rows(kBatch);
      std::vector<Status> st(kBatch);
      uint64_t x = r + 1;
      for (;;) {
        uint64_t seen[kWriters];
        bool done = true;
        for (int w = 0; w < kWriters; ++w) {
          seen[w] = published[w].load(std::memory_order_acquire);
          done = done && seen[w] * kWriters + w >= kRows;
        }
        if (seen[0] == 0 || seen[1] == 0) continue;
        for (uint64_t& id : ids) {
          x = x * 6364136223846793005ULL + 1442695040888963407ULL;
          const int w = static_cast<int>((x >> 60) % kWriters);
          id = ((x >> 17) % seen[w]) * kWriters + w;
        }
        if (!k2->GetBatch(ids, rows, st).ok()) return 4;
        for (size_t i = 0; i < kBatch; ++i) {
          if (!st[i].ok()) {
            fprintf(stderr, "reader: row %lu missing: %s\n", ids[i],
                    st[i].ToString().c_str());
            return 5;
          }
          if (!RowMatches(rows[i], ids[i], 0, 16)) return 6;
        }
        if (done) return 0;
      }
    }));
  }
  for (pid_t k : children) EXPECT_EQ(WaitChild(k), 0);
  munmap(published, 4096);
  Row row;
  for (uint64_t id = 0; id < kRows; ++id) {
    ASSERT_TRUE(cache->Get(id, &row).ok()) << id;
    ASSERT_TRUE(RowMatches(row, id, 0, 16)) << id;
  }
  size_t tables = 0;
  for (const std::string& f : server_->ShmFiles()) {
    tables +=
        f.find(".table." + std::to_string(cache->cache_id()) + ".") != std::string::npos;
  }
  EXPECT_GE(tables, 3u) << "the index grew";
}

}  // namespace
}  // namespace shmcache::test
