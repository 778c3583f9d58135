// shard_worker: one "device" of a multi-process training job, in C++.
//
//   shard_worker --session_id S [--device K --num_devices N] [--rows R]
//                [--row_bytes B] [--epochs E] [--port P] [--size_mb M]
//                [--spilling 1]
//
// Every row is a deterministic function of its id (the "source"). Epoch 1
// reads this device's shard, later epochs read every row; a miss loads the
// row from the source and puts it, a hit is checked byte for byte. Run N of
// these at once on one session: the host ends up holding each row once.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shmcache/client.h"

namespace {

void FillRow(uint64_t id, std::vector<uint8_t>* row) {
  uint64_t x = id * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& b : *row) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
}

long Arg(int argc, char** argv, const char* name, long fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::strtol(argv[i + 1], nullptr, 10);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  long session = Arg(argc, argv, "--session_id", -1);
  long device = Arg(argc, argv, "--device", 0);
  long devices = Arg(argc, argv, "--num_devices", 1);
  long rows = Arg(argc, argv, "--rows", 10000);
  long row_bytes = Arg(argc, argv, "--row_bytes", 3072);
  long epochs = Arg(argc, argv, "--epochs", 2);
  long port = Arg(argc, argv, "--port", 0);
  long size_mb = Arg(argc, argv, "--size_mb", 0);
  long spilling = Arg(argc, argv, "--spilling", 0);
  if (session < 0 || devices < 1 || size_mb < 0 || device < 0 || device >= devices ||
      rows < 1 || row_bytes < 1 || epochs < 1) {
    std::fprintf(stderr,
                 "usage: shard_worker --session_id S [--device K --num_devices N] "
                 "[--rows R] [--row_bytes B] [--epochs E] [--port P]\n");
    return 1;
  }
  shmcache::ClientOptions co;
  co.port = static_cast<int>(port);
  std::unique_ptr<shmcache::Client> client;
  std::unique_ptr<shmcache::Cache> cache;
  shmcache::Status s = shmcache::Client::Connect(co, &client);
  if (s.ok()) {
    shmcache::CacheOptions opts;
    opts.session_id = static_cast<uint32_t>(session);
    opts.name = "shard-example";
    opts.size_mb = static_cast<uint64_t>(size_mb < 0 ? 0 : size_mb);
    opts.spill_requested = spilling != 0;
    opts.fingerprint = "shard-example:rows=" + std::to_string(rows) +
                       ":bytes=" + std::to_string(row_bytes);
    s = client->OpenCache(opts, &cache);
  }
  if (!s.ok()) {
    if (s.IsNotFound() || s.IsInvalidArgument()) {
      std::fprintf(stderr, "device %ld: %s\n", device, s.ToString().c_str());
      return 1;
    }
    std::fprintf(stderr,
                 "device %ld: warning: cache unavailable (%s); reading "
                 "from the source\n",
                 device, s.ToString().c_str());
  }
  std::vector<uint8_t> expect(static_cast<size_t>(row_bytes));
  shmcache::Row row;
  long hits = 0, misses = 0, bad = 0;
  for (long e = 0; e < epochs; ++e) {
    auto t0 = std::chrono::steady_clock::now();
    long first = e == 0 ? device : 0, step = e == 0 ? devices : 1;
    const long hits_before = hits, misses_before = misses;
    for (long i = first; i < rows; i += step) {
      FillRow(static_cast<uint64_t>(i), &expect);
      if (cache && cache->Get(static_cast<uint64_t>(i), &row).ok()) {
        ++hits;
        auto col = row.find("data");
        if (!col || col->nbytes != expect.size() ||
            std::memcmp(col->data, expect.data(), expect.size()) != 0) {
          ++bad;
        }
        continue;
      }
      ++misses;
      if (cache) {
        shmcache::Status p =
            cache->Put(static_cast<uint64_t>(i), expect.data(), expect.size());
        if (!p.ok() && !p.IsFull()) {
          std::fprintf(stderr, "device %ld: warning: %s\n", device, p.ToString().c_str());
          cache.reset();
        }
      }
    }
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "device %ld epoch %ld: %ld rows (%s): %ld hits, %ld misses (loaded and put), "
        "%.3f s\n",
        device, e + 1, hits - hits_before + misses - misses_before,
        e == 0 ? "its shard" : "every device's", hits - hits_before,
        misses - misses_before, secs);
  }
  std::printf("device %ld: %ld hits, %ld misses, %ld wrong rows\n", device, hits, misses,
              bad);
  return bad == 0 ? 0 : 2;
}
