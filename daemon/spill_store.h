// SpillStore: rows that do not fit in a cache's memory budget, in one
// RocksDB database per instance (<spill dir>/shmcache.<uid>.<port>.spill).
// Keys are cache id (4 bytes, big-endian) + row id (8 bytes, big-endian),
// so one cache's rows form one contiguous range that DropCache deletes and
// compacts away. Values are encoded rows (row_codec.h).
//
// Only the daemon opens the database. Thread safety: all methods may be
// called concurrently (RocksDB is thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shmcache/status.h"

namespace rocksdb {
class DB;
}

namespace shmcache {

class SpillStore {
 public:
  // Opens (creating if needed) the database in `path`.
  static Status Open(const std::string& path, std::unique_ptr<SpillStore>* out);
  ~SpillStore();

  // NoSpace from RocksDB becomes Full with the directory in the message.
  Status Put(uint32_t cache_id, uint64_t row_id, std::span<const std::byte> row);
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
  std::unique_ptr<rocksdb::DB> db_;
  std::string path_;
};

}  // namespace shmcache
