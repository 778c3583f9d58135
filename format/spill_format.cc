#include "format/spill_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <rocksdb/db.h>
#include <rocksdb/table.h>

#include "format/shm_file.h"

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

// The index names each data block's first key too: a reader's iterator
// seek (lib/spill_reader.cc, for large rows) then loads only the block that
// holds the key, not the first block at or after it in every level-0 file
// whose range holds the key (each file of a shuffled fill spans the cache's
// ids; every file did when the daemon's flush marker, daemon/spill_store.cc,
// was the last key of all): at 1 MB rows that was 0.45 more checksummed
// blocks per row read.
//
// A data block takes another row only while both fit in block_size (4 KB).
// RocksDB's default (block_size_deviation 10) let a block under 90% full
// take one more, so two 3 KB rows made a 6 KB block, and a reader, with no
// block cache, checksums the whole block at every read: a 3 KB row's read
// checksummed its neighbour's bytes too (XXH3 a third of a 3 KB MultiGet's
// instructions; docs/spill-reads.md). Rows of 4 KB or more were a block of
// their own already; small rows still share one, up to 4 KB.
static rocksdb::BlockBasedTableOptions SpillTableOptions() {
  rocksdb::BlockBasedTableOptions t;
  t.index_type = rocksdb::BlockBasedTableOptions::kBinarySearchWithFirstKey;
  t.block_size_deviation = 99;  // 100 would turn the rule off
  return t;
}

rocksdb::Options SpillDbOptions() {
  rocksdb::Options o;
  o.compression = rocksdb::kNoCompression;
  // No BlobDB: the clients read through secondary instances, which RocksDB
  // does not support for blob files (7.8 crashes in BlobSource's cache key
  // on a secondary's blob read; upstream marks the pair incompatible). A
  // large row is one data block of its own in a table file instead.
  //
  // RocksDB's own table options otherwise: in interleaved runs here (3 KB
  // rows, one process, docs/spill-reads.md) a 64 MB block cache with a
  // bloom filter and a hash index in the data blocks read 1.5-5x slower
  // than the defaults.
  //
  // No periodic statistics dump: it needs a timer thread, which a forked
  // reader process does not have.
  o.stats_dump_period_sec = 0;
  o.stats_persist_period_sec = 0;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(SpillTableOptions()));
  return o;
}

rocksdb::Options SpillReaderOptions() {
  rocksdb::Options o = SpillDbOptions();
  o.allow_mmap_reads = true;
  // A bloom filter of whole keys in the reader's memtables (what it
  // replays from the daemon's log). Once the daemon has flushed, a reader
  // holds its flush marker alone there (daemon/spill_store.cc), and every
  // key a MultiGet asks for was looked for in that one-entry skip list
  // first: 3.4% of a 3 KB GetBatch's instructions (callgrind,
  // docs/spill-reads.md), where a read-only database, whose memtable is
  // empty, skips it. RocksDB uses the filter while the memtable holds no
  // range deletion. Its size: 0.1% of the 64 MB a memtable may reach,
  // 64 KB per memtable.
  o.memtable_whole_key_filtering = true;
  o.memtable_prefix_bloom_size_ratio = 0.001;
  rocksdb::BlockBasedTableOptions t = SpillTableOptions();
  t.no_block_cache = true;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

std::string ReadSpillRecord(const InstancePaths& paths, std::string* refused) {
  std::string text;
  int fd = -1;
  // The record names a directory a restarted daemon may destroy: one that
  // someone else wrote (or linked) is never believed.
  Status s = OpenOwnedFile(paths.SpillRecordFile(), O_RDONLY, &fd);
  if (!s.ok()) {
    if (!s.IsNotFound() && refused != nullptr) *refused = s.message();
    return text;
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(fd);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

uint64_t MemtableEntries(rocksdb::DB& db) {
  uint64_t active = 0, immutable = 0;
  db.GetIntProperty(rocksdb::DB::Properties::kNumEntriesActiveMemTable, &active);
  db.GetIntProperty(rocksdb::DB::Properties::kNumEntriesImmMemTables, &immutable);
  return active + immutable;
}

}  // namespace shmcache
