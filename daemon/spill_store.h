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
#include <unordered_map>
#include <vector>

#include "format/protocol.h"
#include "port/mutex.h"
#include "shmcache/status.h"

namespace rocksdb {
class DB;
class Status;
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
  // and the same latch as Put.
  // `max_id`, when a cache is named, is the highest row id of that cache
  // in the batch (WriteRows's ingestion goes by it).
  static constexpr uint32_t kNoCache = 0;  // cache ids are never 0
  Status Write(rocksdb::WriteBatch* batch, uint64_t bytes, uint32_t cache_id = kNoCache,
               uint64_t max_id = 0);

  // A row for WriteRows: its id and encoded bytes, which the caller keeps
  // until WriteRows returns.
  struct Row {
    uint64_t id;
    std::span<const std::byte> bytes;
  };
  // Writes rows of cache `cache_id` (`bytes` of them) at once, with the
  // same checks and latch as Write; of rows with the same id the last one
  // wins. At least kIngestBytes of them, whose ids all lie past every row
  // of the cache in the database (as a fill in id order writes them), go
  // in as one table file that the database takes in whole
  // (IngestExternalFile, the file moved in), past the write-ahead log and
  // the memtables: the log's checksum and write, the memtable insert and
  // the later flush cost a large row far more than the file does, and each
  // file costs a fixed part that small batches do not earn back
  // (docs/spill-reads.md, "Large batches as table files"). Others go
  // through the log as Write. What Write promises holds for a file:
  // readers' secondary instances see its rows at their next catch-up (it
  // is in the MANIFEST they replay), the rows are in the database before
  // WriteRows returns (a SIGKILL after loses none), DropCache's range
  // deletion covers it, and a file never holds a row the database has in
  // any version (Ingest says why), so the newest value wins in readers too.
  Status WriteRows(uint32_t cache_id, std::span<const Row> rows, uint64_t bytes);
  static constexpr uint64_t kIngestBytes = protocol::kSpillIngestBytes;
  // Files Ingest writes before the database takes them in, in its
  // directory: "<kIngestPrefix><n>.tmp". Open removes those a killed
  // server left.
  static constexpr char kIngestPrefix[] = "shmcache-ingest-";
  // Values of ids[i] into (*values)[i]; (*found)[i] false when absent.
  Status MultiGet(uint32_t cache_id, std::span<const uint64_t> ids,
                  std::vector<std::string>* values, std::vector<bool>* found);
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
  // The flushing thread: flushes the memtables once no write came for
  // kIdleFlushMs after the last one, until StopFlusher.
  void FlushWhenIdle();
  void StopFlusher();
  // Writes the key that lets readers drop what a flush wrote out.
  void WriteFlushMarker();
  rocksdb::Status PutFlushMarker() REQUIRES(write_mu_);
  // A write went in: the flushing thread waits for the next idle spell.
  void NoteWrite();
  // WriteRows's table file: OK; *refused (nothing written) when the
  // database holds keys in its range; another error otherwise.
  Status Ingest(uint32_t cache_id, std::span<const Row> rows, uint64_t bytes,
                uint64_t max_id, bool* refused);
  // Whether rows of `cache_id` from `min_id` on may go in as a file: every
  // row of it this store wrote has a lower id, it was not dropped, and no
  // file of it was refused.
  bool MayIngest(uint32_t cache_id, uint64_t min_id);
  void NoteRowsLocked(uint32_t cache_id, uint64_t max_id) REQUIRES(write_mu_);
  // The checks every write passes first (see Put): OK, or why the rows
  // cannot be written.
  Status CheckWritable(uint64_t bytes);
  // Marks the store failed with `s` (not OK); returns it.
  Status Fail(Status s);
  void RemoveIngestLeftovers();

  std::unique_ptr<rocksdb::DB> db_;
  std::string path_;
  int dir_fd_ = -1;  // the database's directory, held from Open on
  Memtables memtables_ = kSmallMemtables;
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> next_ingest_{0};  // names Ingest's files
  Mutex error_mu_;
  std::string error_ GUARDED_BY(error_mu_);  // why writes stopped
  // Held around every write to the database (the rows', a dropped cache's
  // range deletion and the flush marker's): RocksDB takes concurrent
  // writes, but the rows' writers were one at a time (the Store's lock) and
  // the marker comes from the flusher;
  // one at a time keeps the log's writes ordered by a lock that
  // ThreadSanitizer sees (Debian's RocksDB is not instrumented).
  Mutex write_mu_;
  // Per cache written since Open: the highest row id written (UINT64_MAX:
  // no more files for it).
  std::unordered_map<uint32_t, uint64_t> highest_ GUARDED_BY(write_mu_);
  Mutex flush_mu_;
  CondVar flush_cv_;
  bool unflushed_ GUARDED_BY(flush_mu_) = false;  // a write since the last flush
  bool closing_ GUARDED_BY(flush_mu_) = false;
  std::chrono::steady_clock::time_point last_write_ GUARDED_BY(flush_mu_);
  std::thread flusher_;
};

}  // namespace shmcache
