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
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
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

// The flags and their ranges; every value is a whole decimal number.
struct Flag {
  const char* name;
  long lo, hi;
  long value;
};

// Reads argv into `flags`: each flag followed by its value (given twice,
// the last counts).
// A flag it does not know, a missing value, or one that is not a whole
// number in the flag's range is an error (a message on stderr, false):
// strtol took "abc" as 0 (session 0), "10x" as 10, and 2^32 + S as S.
bool ParseFlags(int argc, char** argv, std::vector<Flag>* flags) {
  for (int i = 1; i < argc; i += 2) {
    Flag* flag = nullptr;
    for (Flag& f : *flags) {
      if (std::strcmp(argv[i], f.name) == 0) flag = &f;
    }
    if (flag == nullptr) {
      std::fprintf(stderr, "shard_worker: unknown argument '%s'\n", argv[i]);
      return false;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "shard_worker: %s needs a value\n", flag->name);
      return false;
    }
    const char* text = argv[i + 1];
    const char* end = text + std::strlen(text);
    long v = 0;
    const auto [ptr, ec] = std::from_chars(text, end, v);
    if (ec != std::errc{} || ptr != end || v < flag->lo || v > flag->hi) {
      std::fprintf(stderr, "shard_worker: %s '%s' is not a whole number in %ld..%ld\n",
                   flag->name, text, flag->lo, flag->hi);
      return false;
    }
    flag->value = v;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // Defaults; --session_id has none (0: not given).
  std::vector<Flag> flags = {{"--session_id", 1, 4294967295L, 0},
                             {"--device", 0, 65535, 0},
                             {"--num_devices", 1, 65536, 1},
                             {"--rows", 1, 1L << 40, 10000},
                             {"--row_bytes", 1, 1L << 30, 3072},
                             {"--epochs", 1, 1000000, 2},
                             {"--port", 1025, 65535, 0},
                             {"--size_mb", 0, 1L << 40, 0},
                             {"--spilling", 0, 1, 0}};
  const char* usage =
      "usage: shard_worker --session_id S [--device K --num_devices N] [--rows R] "
      "[--row_bytes B] [--epochs E] [--port P] [--size_mb M] [--spilling 1]\n";
  if (!ParseFlags(argc, argv, &flags)) {
    std::fputs(usage, stderr);
    return 1;
  }
  const long session = flags[0].value, device = flags[1].value, devices = flags[2].value,
             rows = flags[3].value, row_bytes = flags[4].value, epochs = flags[5].value,
             port = flags[6].value, size_mb = flags[7].value, spilling = flags[8].value;
  if (session == 0 || device >= devices) {
    std::fprintf(stderr, "shard_worker: %s\n%s",
                 session == 0 ? "--session_id is required ('shmcache -g' prints one)"
                              : "--device must be below --num_devices",
                 usage);
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
    opts.size_mb = static_cast<uint64_t>(size_mb);
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
