// The spill database's format, shared by the daemon (which writes it) and
// the clients (which read it themselves, spill_reader.h): the key of a row
// and the RocksDB options both sides open it with.
//
// Keys are cache id (4 bytes, big-endian) + row id (8 bytes, big-endian),
// so one cache's rows form one contiguous range. Values are encoded rows
// (row_codec.h), which carry their row id.
#pragma once

#include <rocksdb/options.h>
#include <rocksdb/slice.h>

#include <cstdint>

namespace shmcache {

struct SpillKey {
  char bytes[12];
  SpillKey(uint32_t cache_id, uint64_t row_id);
  rocksdb::Slice slice() const { return rocksdb::Slice(bytes, sizeof bytes); }
};

// Rows are written once and read many times at random, many of them large
// and already dense (tensors): no compression, values of kSpillBlobMinBytes
// and more in integrated BlobDB blob files (a point read of a large row is
// one pread, and compactions move only the small keys), a bloom filter and
// a block cache of kSpillBlockCacheBytes per process for the small rows
// and the index. The benchmarks' RocksDB peer (benchmarks/bench_rocksdb.cc)
// runs with these options too.
inline constexpr uint64_t kSpillBlobMinBytes = 4096;
inline constexpr size_t kSpillBlockCacheBytes = 64u << 20;
rocksdb::Options SpillDbOptions();

}  // namespace shmcache
