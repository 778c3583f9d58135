// The spill database's format, shared by the daemon (which writes it) and
// the clients (which read it themselves, spill_reader.h): the key of a row
// and the RocksDB options both sides open it with.
//
// Keys are cache id (4 bytes, big-endian) + row id (8 bytes, big-endian),
// so one cache's rows form one contiguous range. Values are encoded rows
// (row_codec.h), which carry their row id.
#pragma once

#include <cstdint>

#include <rocksdb/options.h>
#include <rocksdb/slice.h>

namespace shmcache {

struct SpillKey {
  char bytes[12];
  SpillKey(uint32_t cache_id, uint64_t row_id);
  rocksdb::Slice slice() const { return rocksdb::Slice(bytes, sizeof bytes); }
};

// Rows are written once and read many times at random, many of them large
// and already dense (tensors): RocksDB's defaults with no compression (why
// not BlobDB or a larger block cache: spill_format.cc and
// docs/spill-reads.md). The benchmarks' RocksDB peer
// (benchmarks/bench_rocksdb.cc) runs with these options too.
rocksdb::Options SpillDbOptions();

}  // namespace shmcache
