// RocksDB's CRC32C by the CPU (daemon/rocksdb_crc32c.h): the same checksum
// as RocksDB's own tables, for every length, alignment and continuation;
// RocksDB's calls reach it; and a log written with it is read back by
// RocksDB's own code (as a reader without the interposer reads it).
#include "daemon/rocksdb_crc32c.h"

#include <dlfcn.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include "format/spill_format.h"
#include "tests/support/files.h"

namespace rocksdb::crc32c {
uint32_t Extend(uint32_t crc, const char* buf, size_t size);
}  // namespace rocksdb::crc32c

namespace shmcache {
namespace {

TEST(RocksdbCrc32c, KnownValues) {
  if (!RocksdbCrc32cByCpu()) GTEST_SKIP() << "no SSE4.2";
  // RFC 3720's check value, and 32 zero bytes (RocksDB's crc32c_test).
  EXPECT_EQ(Crc32cExtendByCpu(0, "123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32cExtendByCpu(0, zeros.data(), zeros.size()), 0x8a9136aau);
}

TEST(RocksdbCrc32c, ByCpuMatchesRocksdbsOwnForEveryLengthAndAlignment) {
  if (!RocksdbCrc32cByCpu()) GTEST_SKIP() << "no SSE4.2";
  std::mt19937_64 rng(36);
  std::vector<char> buf(3 * 8192 * 2 + 64);
  for (char& c : buf) c = static_cast<char>(rng());
  // Around each path's edges: bytes before alignment, 8-byte words, the
  // three streams of 256 and of 8192 bytes.
  std::vector<size_t> sizes;
  for (size_t s = 0; s < 80; ++s) sizes.push_back(s);
  for (size_t edge :
       {size_t{768}, size_t{24576}, size_t{49152}}) {  // 3 x 256, 3 x 8192, twice that
    for (size_t s = edge - 9; s <= edge + 9; ++s) sizes.push_back(s);
  }
  for (int i = 0; i < 200; ++i) sizes.push_back(rng() % (buf.size() - 16));
  for (size_t size : sizes) {
    for (size_t offset = 0; offset < 9; ++offset) {
      const char* p = buf.data() + offset;
      const uint32_t want = Crc32cExtendByRocksdb(0, p, size);
      ASSERT_EQ(Crc32cExtendByCpu(0, p, size), want) << size << " bytes at +" << offset;
      // Continued: the CRC of a prefix extended by the rest.
      const size_t cut = size / 3;
      ASSERT_EQ(Crc32cExtendByCpu(Crc32cExtendByCpu(0, p, cut), p + cut, size - cut),
                want)
          << size << " bytes cut at " << cut;
    }
  }
}

TEST(RocksdbCrc32c, RocksdbsCallsReachTheInterposer) {
  // librocksdb.so binds Extend through its PLT to the first definition in
  // the lookup order: this executable's, when it exports it.
  void* bound = dlsym(RTLD_DEFAULT, "_ZN7rocksdb6crc32c6ExtendEjPKcm");
  ASSERT_NE(bound, nullptr);
  EXPECT_EQ(bound, reinterpret_cast<void*>(&rocksdb::crc32c::Extend));
  void* rocksdbs = dlsym(RTLD_NEXT, "_ZN7rocksdb6crc32c6ExtendEjPKcm");
  ASSERT_NE(rocksdbs, nullptr) << "librocksdb.so no longer exports crc32c::Extend";
  EXPECT_NE(rocksdbs, bound);
}

// Rows written through the log with the CPU's CRC, the database closed
// before any flush: RocksDB's own CRC (a reader's, or a daemon's without
// the interposer) replays the log and finds every row.
TEST(RocksdbCrc32c, ALogWrittenByCpuIsReadByRocksdbsOwn) {
  if (!RocksdbCrc32cByCpu()) GTEST_SKIP() << "no SSE4.2";
  test::TempDir tmp(test::TestTmpRoot());
  const std::string dir = tmp.path() + "/db";
  rocksdb::Options o = SpillDbOptions();
  o.create_if_missing = true;
  o.avoid_flush_during_shutdown = true;
  std::mt19937_64 rng(7);
  std::vector<std::string> rows;
  for (size_t size : {size_t{100}, size_t{3000}, size_t{150000}, size_t{1} << 20}) {
    std::string r(size, '\0');
    for (char& c : r) c = static_cast<char>(rng());
    rows.push_back(std::move(r));
  }
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const uint64_t calls = RocksdbCrc32cCallsForTest();
    for (size_t i = 0; i < rows.size(); ++i) {
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), std::to_string(i), rows[i]).ok());
    }
    // The log's records were checksummed here, not inside librocksdb.
    EXPECT_GE(RocksdbCrc32cCallsForTest() - calls, rows.size());
    ASSERT_TRUE(db->Close().ok());
  }
  SetRocksdbCrc32cByCpu(false);
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kAbsoluteConsistency;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status opened = rocksdb::DB::Open(o, dir, &raw);
  SetRocksdbCrc32cByCpu(true);
  ASSERT_TRUE(opened.ok()) << opened.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string v;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), std::to_string(i), &v).ok()) << i;
    EXPECT_EQ(v, rows[i]) << i;
  }
}

}  // namespace
}  // namespace shmcache
