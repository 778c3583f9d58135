#include "benchmarks/rocksdb_peer.h"

#include <string>

#include <rocksdb/cache.h>
#include <rocksdb/table.h>

#include "benchmarks/bench_util.h"

namespace bench {

void TuneNoCompression(rocksdb::Options* o) { o->compression = rocksdb::kNoCompression; }

void TuneBlobDb(rocksdb::Options* o) {
  o->compression = rocksdb::kNoCompression;
  o->enable_blob_files = true;
  o->min_blob_size = 4096;
  o->blob_compression_type = rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = rocksdb::NewLRUCache(256u << 20);
  o->table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
}

double MultiGetRate(double seconds, rocksdb::DB* db, const std::vector<uint32_t>& idx,
                    uint64_t offset, size_t size) {
  constexpr size_t kBatch = kMultiGetBatch;
  std::vector<uint64_t> ids(kBatch);
  std::vector<rocksdb::Slice> keys(kBatch);
  std::vector<rocksdb::PinnableSlice> values(kBatch);
  std::vector<rocksdb::Status> sts(kBatch);
  std::vector<std::string> out(kBatch);
  bool good = true;
  double rate = TimedRateBatched(seconds, kBatch, [&](uint64_t i) {
    for (size_t k = 0; k < kBatch; ++k) {
      ids[k] = idx[(i * kBatch + k + offset) & (idx.size() - 1)];
      keys[k] = rocksdb::Slice(reinterpret_cast<const char*>(&ids[k]), sizeof ids[k]);
      values[k].Reset();
    }
    db->MultiGet(rocksdb::ReadOptions(), db->DefaultColumnFamily(), kBatch, keys.data(),
                 values.data(), sts.data());
    for (size_t k = 0; k < kBatch; ++k) {
      good &= sts[k].ok() && values[k].size() == size;
      out[k].assign(values[k].data(), values[k].size());
    }
  });
  return good ? rate : -1;
}

}  // namespace bench
