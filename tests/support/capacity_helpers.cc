#include "tests/support/capacity_helpers.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace shmcache::test {

uint64_t SegmentBytes(const TestServer& server) {
  uint64_t total = 0;
  for (const std::string& n : server.ShmFiles()) {
    if (n.find(".seg.") == std::string::npos) continue;
    struct stat st;
    if (stat((server.shm_dir() + "/" + n).c_str(), &st) == 0) total += st.st_size;
  }
  return total;
}

std::unique_ptr<Cache> OpenCache(const TestServer& server, uint32_t session,
                                 uint64_t size_mb, bool spilling,
                                 const std::string& name) {
  std::unique_ptr<Client> client;
  EXPECT_TRUE(server.Connect(&client).ok());
  std::unique_ptr<Cache> cache;
  Status s = client->OpenCache(CacheNamed(session, name, size_mb, spilling), &cache);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return cache;
}

std::unique_ptr<Cache> OpenCacheInChild(const TestServer& server, uint32_t session,
                                        uint64_t size_mb, bool spilling,
                                        const std::string& name) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  if (server.Connect(&client).ok()) {
    client->OpenCache(CacheNamed(session, name, size_mb, spilling), &cache)
        .PermitUncheckedError();
  }
  return cache;
}

size_t PutRows(Cache* cache, size_t n, uint64_t salt) {
  std::vector<uint8_t> row(kRowBytes);
  size_t stored = 0;
  for (size_t i = 0; i < n; ++i) {
    FillPattern(i, salt, row.data(), row.size());
    Status s = cache->Put(i, row.data(), row.size());
    if (s.IsFull()) continue;
    EXPECT_TRUE(s.ok()) << "row " << i << ": " << s.ToString();
    ++stored;
  }
  return stored;
}

long CheckRowsInChild(const TestServer& server, uint32_t session, size_t n, bool spilling,
                      uint64_t salt, const std::string& name) {
  int fds[2];
  if (pipe(fds) != 0) return -2;
  pid_t pid = ForkChild([&]() -> int {
    close(fds[0]);
    std::unique_ptr<Client> client;
    if (!server.Connect(&client).ok()) return 3;
    std::unique_ptr<Cache> cache;
    if (!client->OpenCache(CacheNamed(session, name, 1, spilling), &cache).ok()) {
      return 4;
    }
    long found = 0;
    Row row;
    for (size_t i = 0; i < n; ++i) {
      Status s = cache->Get(i, &row);
      if (s.IsNotFound()) continue;
      if (!s.ok()) return 5;
      auto col = row.find("data");
      std::vector<uint8_t> want = Pattern(i, salt, kRowBytes);
      if (!col || col->nbytes != want.size() ||
          std::memcmp(col->data, want.data(), want.size()) != 0) {
        found = -1;
        break;
      }
      ++found;
    }
    ssize_t w = write(fds[1], &found, sizeof found);
    return w == sizeof found ? 0 : 6;
  });
  close(fds[1]);
  long found = -3;
  ssize_t r = read(fds[0], &found, sizeof found);
  close(fds[0]);
  EXPECT_EQ(WaitChild(pid), 0);
  return r == sizeof found ? found : -4;
}

Status PutRowBatch(Cache* cache, uint64_t first, std::span<Status> statuses,
                   std::span<bool> inserted, uint64_t salt) {
  const size_t n = statuses.size();
  std::vector<uint64_t> ids(n);
  std::vector<std::vector<uint8_t>> data(n);
  std::vector<int64_t> shapes(n, static_cast<int64_t>(kRowBytes));
  std::vector<ColumnRef> cols(n);
  std::vector<std::span<const ColumnRef>> rows(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = first + i;
    data[i] = Pattern(first + i, salt, kRowBytes);
    cols[i] = {"data", DType::kUInt8, std::span(&shapes[i], 1), data[i].data(),
               kRowBytes};
    rows[i] = std::span(&cols[i], 1);
  }
  return cache->PutBatch(ids, rows, statuses, inserted);
}

Status PutBytes(Cache* cache, uint64_t id, size_t nbytes, bool* inserted) {
  std::vector<uint8_t> row(nbytes);
  FillPattern(id, 7, row.data(), row.size());
  return cache->Put(id, row.data(), row.size(), inserted);
}

}  // namespace shmcache::test
