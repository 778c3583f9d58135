// SpillReader: a client's own reader of the instance's spill database, so
// that a spilled row costs a RocksDB read in the reading process and no
// daemon round trip (docs/spill-reads.md has the measurement that chose
// this over rows handed over in shared memory).
//
// It is a RocksDB secondary instance: it takes no lock, writes nothing (its
// info log is discarded, so it needs no directory of its own) and sees the
// daemon's writes up to its last catch-up. A row the index shows spilled is
// in the database before the index says so (the daemon writes it first),
// so a row the reader cannot find is newer than its view: the caller
// catches up (MaybeCatchUp) and, failing that, asks the daemon. Any other
// failure is also answered by asking the daemon: the reader only ever
// saves round trips, it never decides that a row is missing.
//
// Thread safety: all methods may be called concurrently. A reader belongs
// to the process that opened it: after fork() the child opens its own
// (ForInstance does).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "format/instance.h"
#include "shmcache/status.h"

namespace rocksdb {
class DB;
}

namespace shmcache {

// What SpillReader::MultiGet hands each row it found to: any callable
// (size_t i, std::span<const std::byte> bytes), borrowed for the call. A
// std::function of the caller's lambda was a heap allocation per call (its
// captures did not fit in the function itself).
class FoundRow {
 public:
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FoundRow>)
      FoundRow(F&& f)  // NOLINT(bugprone-forwarding-reference-overload): constrained
      : f_(&f), call_([](void* p, size_t i, std::span<const std::byte> bytes) {
          (*static_cast<std::remove_reference_t<F>*>(p))(i, bytes);
        }) {}
  void operator()(size_t i, std::span<const std::byte> bytes) const {
    call_(f_, i, bytes);
  }

 private:
  void* f_;
  void (*call_)(void*, size_t, std::span<const std::byte>);
};

namespace spill_reader_internal {
struct Readers;  // the process's readers, by instance (spill_reader.cc)
}  // namespace spill_reader_internal

class SpillReader {
 public:
  // A cache handle's claim on the reader of its instance. The reader holds
  // the table files and logs of its view open (and the table files
  // mapped), also once the daemon deleted them (a destroyed cache's rows
  // compacted away): it lets go of them at its next catch-up, or when it
  // closes. It closes once no claim on it is left in the process: a
  // process that read spilled rows and closed its caches holds none of the
  // database's disk space. A claim made before fork() counts for nothing
  // in the child. Drop is idempotent; no claim is made after it.
  class Use {
   public:
    Use() = default;
    ~Use() { Drop(); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    void Drop();

   private:
    friend class SpillReader;
    // Gives the claim up, when it is one of this process: the reader, when
    // this was the last claim on it (the caller lets it close outside the
    // registry's lock), else null. Called with the registry's lock held.
    std::shared_ptr<SpillReader> UnclaimLocked(spill_reader_internal::Readers& r);
    // Guarded by the registry's lock.
    std::string key_;        // the instance whose reader is claimed, if held_
    uint64_t fork_gen_ = 0;  // the process generation that claimed it
    bool held_ = false;
    bool dropped_ = false;
  };

  // The process's reader of the instance's spill database (the one the
  // daemon's spill record names), opened on first use; null when there is
  // none or it cannot be opened, then tried again at most once a second.
  // With `use`, claims the instance's reader for it (a claim on another
  // instance's reader is given up); with a dropped `use`, opens none and
  // returns the one open, if any.
  static std::shared_ptr<SpillReader> ForInstance(const InstancePaths& paths,
                                                  Use* use = nullptr);
  // Forgets the instance's reader when it is `stale` (it failed to answer):
  // the next ForInstance reads the spill record again.
  static void Forget(const InstancePaths& paths, const SpillReader* stale);

  static Status Open(const std::string& db_path, std::unique_ptr<SpillReader>* out);
  ~SpillReader();

  // Reads rows ids[i] of the cache. For each one found, calls
  // found(i, bytes) with the encoded row (valid during the call) and sets
  // got[i] true; got[i] is false for rows not found or not readable, which
  // are left to the caller. `row_bytes` is the size the rows are expected
  // to have (the cache's spilled rows' mean, 0 when not known): from
  // kSeekRowBytes up they are read in place. It catches up first when
  // kRefreshIntervalMs passed since the last catch-up. The calling thread
  // keeps the buffers RocksDB copies values into for its next call
  // (spill_reader.cc), so `found` must not call MultiGet itself.
  void MultiGet(uint32_t cache_id, std::span<const uint64_t> ids, size_t row_bytes,
                FoundRow found, std::span<bool> got);
  // Catches up with the daemon's writes, unless another thread does now or
  // one did less than kCatchUpIntervalMs ago (a catch-up replays the
  // daemon's newest log: milliseconds). kFailed: the database cannot be
  // followed any more (removed, replaced): Forget this reader.
  enum class CatchUp { kDone, kSkipped, kFailed };
  CatchUp MaybeCatchUp();
  // Rows this reader holds in its own memtables (replayed from the daemon's
  // write-ahead log), which it searches before its table files.
  uint64_t MemtableRows();

  const std::string& path() const { return path_; }
  // Rows the readers of this process handed over in place (read by seeks,
  // kSeekRowBytes) since it started: which of the two ways a caller's rows
  // took, which nothing else shows (both end as a copy in the caller's row).
  static uint64_t RowsReadInPlace();

  static constexpr int64_t kCatchUpIntervalMs = 50;
  // MultiGet catches up first when the last catch-up is older than this: a
  // reader that finds every row it asks for would otherwise never see the
  // daemon flush its memtables (SpillStore flushes once writes stop), and
  // would go on searching, and holding, the rows it replayed from the log.
  static constexpr int64_t kRefreshIntervalMs = 1000;
  // A thread's MultiGet keeps the buffers RocksDB copies values into from
  // call to call, each up to this size (spill_reader.cc says why).
  static constexpr size_t kKeptValueBytes = 16 << 10;
  // Rows expected to be this size or more are read by iterator seeks
  // (their values point into the mapped table file) instead of MultiGet
  // (which copies each value once more): see spill_reader.cc.
  static constexpr size_t kSeekRowBytes = 64 << 10;

 private:
  SpillReader() = default;
  CatchUp CatchUpUnlessWithin(int64_t interval_ms);
  // MultiGet's two ways.
  void ReadByMultiGet(uint32_t cache_id, std::span<const uint64_t> ids, FoundRow found,
                      std::span<bool> got);
  void ReadBySeek(uint32_t cache_id, std::span<const uint64_t> ids, FoundRow found,
                  std::span<bool> got);

  std::unique_ptr<rocksdb::DB> db_;
  std::string path_;
  std::atomic<bool> catching_up_{false};
  std::atomic<int64_t> last_catch_up_ms_{0};
};

}  // namespace shmcache
