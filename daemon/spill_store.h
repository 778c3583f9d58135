// SpillStore: rows that do not fit in a cache's memory budget, in one
// RocksDB database per instance (<spill dir>/shmcache.<uid>.<port>.spill).
// Keys and options: format/spill_format.h (one cache's rows form one
// contiguous range that DropCache deletes and compacts away).
//
// Only the daemon writes the database; clients read it themselves through
// a RocksDB secondary instance (lib/spill_reader.h), which takes no lock.
// Once writes stop for kIdleFlushMs, a thread of the store flushes the
// memtables to a table file: rows left in them would stay, for as long as
// nothing more is spilled, in every reader's memtable (which a secondary
// instance fills from the write-ahead log), and every key a reader looks up
// would be searched there first (a fifth of a 3 KB spilled read's time:
// docs/performance.md, issue 36). Readers drop theirs at their next
// catch-up (lib/spill_reader.h), once the store wrote one key after the
// flush (WriteFlushMarker says why).
//
// Thread safety: all methods may be called concurrently (RocksDB is
// thread-safe). The flushing thread ends in DestroyAll or the destructor,
// before the database closes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "format/spill_format.h"
#include "port/mutex.h"
#include "shmcache/status.h"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace shmcache {

class SpillStore {
 public:
  // Opens the database in `path`, creating it (mode 0700) if needed and
  // `create`. Before RocksDB sees `path`: no directory on the way may be one
  // another user could swap for a link (CheckNoOtherUserCanReplace), and
  // `path` must be a directory of this user's, never a link
  // (OpenOwnedDir, format/owned_dir.h); otherwise PermissionDenied naming
  // what is there and the fix. *tightened (when given): a line saying a
  // directory of ours that others could read was made 0700, else "".
  static Status Open(const std::string& path, std::unique_ptr<SpillStore>* out,
                     bool create = true, std::string* tightened = nullptr);
  ~SpillStore();

  // Full, without touching RocksDB, when the disk lacks room for the row
  // plus flushing every memtable, or after any earlier write error: RocksDB must
  // not see another write once one failed (Debian's build asserts on it).
  // IOError naming the cause when the database's directory was removed
  // under the server or its free space cannot be read; no write is tried
  // after that either.
  Status Put(uint32_t cache_id, uint64_t row_id, std::span<const std::byte> row);
  // Writes a batch of rows (`bytes` of them) at once, with the same checks
  // and the same latch as Put. `last` is the key of its last row (where
  // the next flush marker goes: WriteFlushMarker).
  Status Write(rocksdb::WriteBatch* batch, uint64_t bytes, const SpillKey& last);
  // Values of ids[i] into (*values)[i], with (*statuses)[i]: OK, NotFound
  // when absent, or the error that row's own read met (a table block
  // failing its checksum), which is never another row's.
  Status MultiGet(uint32_t cache_id, std::span<const uint64_t> ids,
                  std::vector<std::string>* values, std::vector<Status>* statuses);
  // Deletes every row of the cache and compacts the range, so the disk
  // space is returned.
  Status DropCache(uint32_t cache_id);
  // Ids of the caches that have rows on disk.
  std::vector<uint32_t> CacheIds();
  // Closes the database and removes its directory, when its name still
  // holds the directory Open opened (IOError, nothing removed, otherwise;
  // OK when it is gone already).
  Status DestroyAll();

  const std::string& path() const { return path_; }

  // Rows written and in no table file yet (the memtables' entries; after
  // an idle flush, the one key written to let readers drop their copies).
  uint64_t UnflushedRows() const;
  static constexpr int kIdleFlushMs = 300;
  // Test hook: whether a write came since the flusher last began a flush
  // (one is due kIdleFlushMs after the last write).
  bool TEST_FlushDue();
  // Test hook: how many times the free space was read (FreeBytesFor).
  uint64_t TEST_SpaceReads() const { return space_reads_.load(); }

  // The memtables RocksDB writes into: their size and how many may be full
  // at once. Rows not yet flushed are held there (and, replayed from the
  // write-ahead log, in every reader's secondary instance) and need this
  // much free disk to be flushed.
  struct Memtables {
    uint64_t bytes;
    int count;
    constexpr uint64_t total() const { return bytes * static_cast<uint64_t>(count); }
  };
  // Where the disk had at least kRoomyDiskBytes free at open: 4 memtables of
  // 16 MB, so that writes go on while one flushes (with 2 of 8 MB, a fill of
  // large rows stopped at every flush: docs/spill-reads.md). 4 of 16 MB
  // filled as fast as 4 of 32 MB and 2 of 64 MB (RocksDB's defaults) and
  // bound the unflushed rows every reader's secondary instance replays into
  // its own memory at 64 MB; 4 of 8 MB were 0.7x at 150 KB and 1 MB rows.
  // On a smaller disk 2 of 8 MB: flushes need little room, and a nearly full
  // disk is noticed before a flush fails.
  static constexpr Memtables kRoomyMemtables{16u << 20, 4};
  static constexpr Memtables kSmallMemtables{8u << 20, 2};
  static constexpr uint64_t kRoomyDiskBytes =
      16 * kRoomyMemtables.bytes * static_cast<uint64_t>(kRoomyMemtables.count);
  static Memtables MemtablesFor(uint64_t free_bytes) {
    return free_bytes >= kRoomyDiskBytes ? kRoomyMemtables : kSmallMemtables;
  }
  Memtables memtables() const { return memtables_; }

 private:
  SpillStore() = default;
  // OK and the free bytes of its file system while the database's directory
  // is there; IOError naming the cause otherwise.
  Status CheckDirectory(uint64_t* free_bytes) const;
  // OK while the database's directory is there (an fstat); IOError naming
  // the cause otherwise.
  Status CheckPresent() const;
  // The free bytes of its file system (an fstatvfs); IOError when they
  // cannot be read.
  Status ReadFreeBytes(uint64_t* free_bytes) const;
  // The free bytes a write of `bytes` goes by: those read at most
  // kSpaceReadInterval ago, less what was written since, read again sooner
  // once the writes since reach a quarter of what was spare beyond the
  // memtables (so a filling disk is read at every write near its end, as
  // before). Read before every write, fstatvfs was one of the 9 system calls
  // of a spilled Put in the daemon (docs/spill-reads.md). Another process
  // filling the disk is seen up to kSpaceReadInterval late; a write that
  // then fails stops spilling, as one that raced a check always could.
  Status FreeBytesFor(uint64_t bytes, uint64_t* free_bytes) EXCLUDES(space_mu_);
  // The flushing thread: flushes the memtables once no write came for
  // kIdleFlushMs after the last one, until StopFlusher.
  void FlushWhenIdle();
  void StopFlusher();
  // Writes the key that lets readers drop what a flush wrote out.
  void WriteFlushMarker();

  std::unique_ptr<rocksdb::DB> db_;
  std::string path_;
  int dir_fd_ = -1;  // the database's directory, held from Open on
  Memtables memtables_ = kSmallMemtables;
  std::atomic<bool> failed_{false};
  static constexpr std::chrono::milliseconds kSpaceReadInterval{100};
  Mutex space_mu_;
  bool space_known_ GUARDED_BY(space_mu_) = false;
  std::chrono::steady_clock::time_point space_read_at_ GUARDED_BY(space_mu_);
  uint64_t space_read_ GUARDED_BY(space_mu_) = 0;     // free bytes then
  uint64_t written_since_ GUARDED_BY(space_mu_) = 0;  // bytes written since
  mutable std::atomic<uint64_t> space_reads_{0};      // fstatvfs calls, for tests
  Mutex error_mu_;
  std::string error_ GUARDED_BY(error_mu_);  // why writes stopped
  // Held around every write to the database (the rows', a dropped cache's
  // range deletion and the flush marker's): RocksDB takes concurrent
  // writes, but the rows' writers were one at a time (the Store's lock) and
  // the marker comes from the flusher;
  // one at a time keeps the log's writes ordered by a lock that
  // ThreadSanitizer sees (Debian's RocksDB is not instrumented).
  Mutex write_mu_ ACQUIRED_BEFORE(flush_mu_);
  Mutex flush_mu_;
  CondVar flush_cv_;
  bool unflushed_ GUARDED_BY(flush_mu_) = false;   // a write since the last flush
  SpillKey last_key_ GUARDED_BY(flush_mu_){0, 0};  // of the last row written
  bool closing_ GUARDED_BY(flush_mu_) = false;
  std::chrono::steady_clock::time_point last_write_ GUARDED_BY(flush_mu_);
  std::thread flusher_;
};

}  // namespace shmcache
