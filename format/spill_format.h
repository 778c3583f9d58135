// The spill database's format, shared by the daemon (which writes it) and
// the clients (which read it themselves, lib/spill_reader.h): the key of a
// row, the RocksDB options both sides open it with, and the record that
// names the database (read by both, written by the daemon:
// daemon/spill_record.h).
//
// Keys are cache id (4 bytes, big-endian) + row id (8 bytes, big-endian),
// so one cache's rows form one contiguous range. Values are encoded rows
// (row_codec.h), which carry their row id.
#pragma once

#include <cstdint>
#include <string>

#include <rocksdb/options.h>
#include <rocksdb/slice.h>

#include "format/instance.h"

namespace rocksdb {
class DB;
}  // namespace rocksdb

namespace shmcache {

struct SpillKey {
  char bytes[12];
  SpillKey(uint32_t cache_id, uint64_t row_id);
  rocksdb::Slice slice() const { return rocksdb::Slice(bytes, sizeof bytes); }
};

// Rows are written once and read many times at random, many of them large
// and already dense (tensors): RocksDB's defaults with no compression and
// an index that names each block's first key (why not BlobDB or a larger
// block cache, and why the index: spill_format.cc and docs/spill-reads.md). The
// benchmarks' RocksDB peer (benchmarks/bench_rocksdb.cc) runs with these options too.
rocksdb::Options SpillDbOptions();

// What a client's reader (lib/spill_reader.h) opens the database with:
// SpillDbOptions, with the table files memory-mapped and no block cache. A
// spilled row is then read in place from the OS page cache, which every
// process on the host shares: no pread and no copy into a per-process
// block cache (RocksDB's default one, 8 MB, holds little of a spill
// database; one large enough would be a copy of it in every trainer).
// Measured against RocksDB at its best (docs/spill-reads.md). The cost: a
// table file that cannot be read (a failing disk) raises SIGBUS in the
// reader where pread would have returned an error.
rocksdb::Options SpillReaderOptions();

// The database the instance's spill record names (a one-line file beside
// the shared-memory files); empty when there is no record (nothing
// recorded, or an index left by a server from before the record) and when
// the record is not this user's own file (see OpenOwnedFile), which
// *refused (when given) then explains.
std::string ReadSpillRecord(const InstancePaths& paths, std::string* refused = nullptr);

// Entries in the memtables of `db` (active and immutable): the daemon's
// rows not yet in a table file, or those a reader's secondary instance
// replayed from the write-ahead log.
uint64_t MemtableEntries(rocksdb::DB& db);

}  // namespace shmcache
