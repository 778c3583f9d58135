// SpillStore: rows that do not fit in a cache's memory budget, in one
// RocksDB database per instance (<spill dir>/shmcache.<uid>.<port>.spill).
// Keys and options: format/spill_format.h (one cache's rows form one
// contiguous range that DropCache deletes and compacts away).
//
// Only the daemon writes the database; clients read it themselves through
// a RocksDB secondary instance (lib/spill_reader.h), which takes no lock.
// Thread safety: all methods may be called concurrently (RocksDB is
// thread-safe).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "port/mutex.h"
#include "shmcache/status.h"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace shmcache {

class SpillStore {
 public:
  // Opens the database in `path`, creating it if needed and `create`.
  static Status Open(const std::string& path, std::unique_ptr<SpillStore>* out,
                     bool create = true);
  ~SpillStore();

  // Full, without touching RocksDB, when the disk lacks room for the row
  // plus a memtable flush, or after any earlier write error: RocksDB must
  // not see another write once one failed (Debian's build asserts on it).
  Status Put(uint32_t cache_id, uint64_t row_id, std::span<const std::byte> row);
  // Writes a batch of rows (`bytes` of them) at once, with the same checks
  // and the same latch as Put.
  Status Write(rocksdb::WriteBatch* batch, uint64_t bytes);
  // Values of ids[i] into (*values)[i]; (*found)[i] false when absent.
  Status MultiGet(uint32_t cache_id, std::span<const uint64_t> ids,
                  std::vector<std::string>* values, std::vector<bool>* found);
  // Deletes every row of the cache and compacts the range, so the disk
  // space is returned.
  Status DropCache(uint32_t cache_id);
  // Ids of the caches that have rows on disk.
  std::vector<uint32_t> CacheIds();
  // Closes the database and removes its directory.
  Status DestroyAll();

  const std::string& path() const { return path_; }

 private:
  SpillStore() = default;
  static constexpr uint64_t kWriteBufferBytes = 8u << 20;

  std::unique_ptr<rocksdb::DB> db_;
  std::string path_;
  std::atomic<bool> failed_{false};
  Mutex error_mu_;
  std::string error_ GUARDED_BY(error_mu_);  // why writes stopped
};

}  // namespace shmcache
