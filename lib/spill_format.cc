#include "spill_format.h"

#include <rocksdb/cache.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>

namespace shmcache {

static void PutBigEndian(char* p, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    p[i] = static_cast<char>(v & 0xFF);
    v >>= 8;
  }
}

SpillKey::SpillKey(uint32_t cache_id, uint64_t row_id) {
  PutBigEndian(bytes, cache_id, 4);
  PutBigEndian(bytes + 4, row_id, 8);
}

rocksdb::Options SpillDbOptions() {
  rocksdb::Options o;
  o.compression = rocksdb::kNoCompression;
  // No BlobDB: the clients read through secondary instances, which RocksDB
  // does not support for blob files (7.8 crashes in BlobSource's cache key
  // on a secondary's blob read; upstream marks the pair incompatible). A
  // large row is one data block of its own in a table file instead.
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = rocksdb::NewLRUCache(kSpillBlockCacheBytes);
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  // No periodic statistics dump: it needs a timer thread, which a forked
  // reader process does not have.
  o.stats_dump_period_sec = 0;
  o.stats_persist_period_sec = 0;
  return o;
}

}  // namespace shmcache
