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
  o.enable_blob_files = true;
  o.min_blob_size = kSpillBlobMinBytes;
  o.blob_compression_type = rocksdb::kNoCompression;
  // Blob files left holding only a dropped cache's rows go with the
  // compaction that deletes its range (DropCache forces one); garbage
  // collection moves the live rows out of older, partly dropped ones.
  o.enable_blob_garbage_collection = true;
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
