// RocksDB as the peer of shmcache's spilled rows is measured
// (bench_rocksdb.cc, bench_spill_check.cc): the tunings both measure, and
// the timed MultiGet round. Keys are row ids, 8 bytes in host order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>

namespace bench {

// Keys per MultiGet call: GetBatch's usual batch.
constexpr size_t kMultiGetBatch = 64;

void TuneNoCompression(rocksdb::Options* o);
// Integrated BlobDB for values of 4 KB and more, uncompressed, with a
// 256 MB block cache.
void TuneBlobDb(rocksdb::Options* o);

// Rows/s of MultiGet of kMultiGetBatch keys per call for `seconds`, call i
// asking for idx[(i * kMultiGetBatch + k + offset) % idx.size()] (idx.size()
// a power of two); each value is copied out of RocksDB's pinned memory into
// a buffer of the caller's, as GetBatch delivers rows. -1 when a get failed
// or a value was not `size` bytes.
double MultiGetRate(double seconds, rocksdb::DB* db, const std::vector<uint32_t>& idx,
                    uint64_t offset, size_t size);

}  // namespace bench
