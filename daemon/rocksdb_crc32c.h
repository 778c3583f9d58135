// RocksDB's CRC32C computed with the CPU's crc32 instruction (SSE4.2).
//
// Every record of RocksDB's write-ahead log carries a CRC32C of its bytes.
// Debian's RocksDB 7.8 is built portable, so its crc32c::Extend computes
// it with tables: about half the log's cost, and the log is 60-70% of the
// daemon's CPU per spilled row (docs/spill-reads.md, "The log's CRC by the
// CPU"). rocksdb_crc32c.cc defines rocksdb::crc32c::Extend itself; linked
// into an executable (not a static library: nothing would pull it in), its
// definition interposes on librocksdb.so's, which calls Extend through its
// PLT. The checksum is the same function (the Castagnoli polynomial), so
// the log's bytes do not change: readers of any build read it as before.
// Where the CPU lacks SSE4.2, or while switched off, RocksDB's own Extend
// (found with dlsym(RTLD_NEXT)) computes it.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shmcache {

// Whether RocksDB's CRC32C is computed here with the CPU's instruction:
// the interposer is linked in, the CPU has SSE4.2, and it is switched on
// (the default).
bool RocksdbCrc32cByCpu();

// Switches the CPU's instruction off (RocksDB's own tables then compute
// every CRC) or back on; for benchmarks that compare the two in one
// process. The checksum is the same either way.
void SetRocksdbCrc32cByCpu(bool on);

// The CRC32C of `size` bytes at `buf`, continuing `crc` (0 to start), as
// RocksDB's crc32c::Extend computes it (pre- and post-inverted), with the
// CPU's instruction. REQUIRES: the CPU has SSE4.2.
uint32_t Crc32cExtendByCpu(uint32_t crc, const char* buf, size_t size);

// The same by RocksDB's own crc32c::Extend (its tables in Debian's build).
uint32_t Crc32cExtendByRocksdb(uint32_t crc, const char* buf, size_t size);

// How many times RocksDB called the interposed Extend in this process
// (either way it computed): a test that a write's log went through it.
uint64_t RocksdbCrc32cCallsForTest();

}  // namespace shmcache
