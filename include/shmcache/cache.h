// Cache: one cache of one session, mapped into this process.
//
// Hits cost no system call: the index and rows live in shared memory mapped
// once per process. Writers bump-allocate inside chunks leased from the
// daemon and publish each row with one atomic store, so readers see a row
// whole or not at all.
//
// Thread safety: all methods may be called concurrently from any thread.
// After fork() the child may go on using the Cache.
// Errors common to every call: InvalidArgument once Close()d, NotFound once
// the cache's session was destroyed. Out-parameters after an error: see
// status.h; views and rows: see row.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "shmcache/export.h"
#include "shmcache/row.h"
#include "shmcache/stats.h"
#include "shmcache/status.h"
#include "shmcache/types.h"

namespace shmcache {

class CacheImpl;

// Row ids of callers are at most kMaxRowId. The ids above it hold the
// cache's own records (ClaimBuild, Seal): a row put there is taken for one.
inline constexpr uint64_t kMaxRowId = ~uint64_t{0} - 16;

class SHMCACHE_EXPORT Cache {
 public:
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // Stores row `id`. If the id is already present the new row is dropped and
  // OK is returned (the first writer wins); *inserted tells which happened:
  // it is set on every return, true only when this call stored the row.
  // One exception: a writer that stalls between claiming the id's index
  // slot and publishing it (descheduled or stopped for longer than the
  // bounded wait of a few thousand yields; see index_table.h) lets a second
  // writer of the same id store it too, and both are told they inserted.
  // Readers always see one whole row: the second copy until the first is
  // published, then the first. Rows of one id are expected to be equal.
  // When the memory budget is used up and the cache spills, the row goes to
  // disk through the daemon.
  // Full: the budget is used up and the cache does not spill, or spilling
  // failed (the cache turns read-only for everyone). Before a cache turns
  // full, a process whose lease found the budget used up is leased room
  // another process holds unused (the end of that one's chunk, which then
  // holds less). A full cache leases no process a new chunk (until a
  // process gives back room of 16 KB or more, closing: then it takes rows
  // again until a lease finds no room for its row); until this
  // process's first Full, a row that still fits what is left of the chunk
  // it leased before is stored.
  // TooLarge: this row does not fit in the memory the cache has left (or in
  // its whole budget) while smaller rows still do: only this row is not
  // cached. A spilling cache sends such a row to disk instead, unless it is
  // larger than a spilled row may be (64 MB less 4 KB, encoded): then too it
  // is TooLarge, nothing was sent, and smaller rows are still accepted.
  // Unavailable: the daemon is gone and a new chunk was needed.
  // InvalidArgument: a column is malformed (sizes, names, too many).
  Status Put(uint64_t id, std::span<const ColumnRef> columns, bool* inserted = nullptr);
  // A row of one uint8 column named "data".
  Status Put(uint64_t id, const void* data, size_t nbytes, bool* inserted = nullptr);
  // Stores rows[i] under ids[i] for every i, as Put would one by one, but
  // takes the put lock once, looks the ids up with their memory misses
  // overlapped, and fills one leased chunk with as many rows as fit.
  // statuses[i] is what Put would return for row i, and inserted[i] (when
  // inserted is not empty) what Put would set. Rows are stored in order: of
  // two rows with one id in a batch, the first wins. Full and Unavailable
  // end the batch: the row that met one and every later row get that
  // status, and the rows before it stay stored. TooLarge and
  // InvalidArgument concern their row only; the rows after it are still
  // stored.
  // Returns OK unless the cache itself is unusable (closed, its session
  // destroyed); then every statuses[i] holds that status too, every
  // inserted[i] is false and no row was stored. InvalidArgument, with
  // nothing stored or written, when rows, statuses or a non-empty inserted
  // does not hold ids.size() elements.
  // Thread safety: as Put; concurrent batches of one process are
  // serialised on the put lock, readers are never blocked.
  Status PutBatch(std::span<const uint64_t> ids,
                  std::span<const std::span<const ColumnRef>> rows,
                  std::span<Status> statuses, std::span<bool> inserted = {});

  // Copies row `id` into *out. NotFound on a miss. A spilled row is read by
  // this process from the spill database; only a row spilled after this
  // process's last look at the database (or one it cannot read there) is
  // asked of the daemon (Unavailable when it cannot be reached). A spilled
  // row that fails its check there (a disk's bit flip: a table block
  // failing its checksum, or bytes that are not the row) is never handed
  // out: the daemon drops it from the cache and the read that found it
  // gets RowDropped (IsNotFound() too: status.h), counted as a miss and in
  // SpilledRowsDropped; later reads miss until a put stores it again.
  // Every other row is served as before. *out is empty after any error
  // (row.h).
  // Inline: a hit under 2 KB is copied by GetHit, which ends in the copy
  // (a tail call of memcpy, its result in a register), so that no register
  // of the caller is restored from the stack after the copy's stores
  // (docs/hit-path.md, "Nothing restored after the copy").
  Status Get(uint64_t id, Row* out) {
    if (GetHit(id, out) != nullptr) [[likely]] {
      return Status::OK();
    }
    return GetFull(id, out);
  }
  // Copies only the named columns, in the order given. NotFound on a miss;
  // ColumnNotFound (IsNotFound() too) when the row is cached but lacks a
  // named column (the message names it).
  Status Get(uint64_t id, std::span<const std::string_view> columns, Row* out);
  // A read-only view of row `id`, no copy: into shared memory for a row in
  // memory, into a buffer of the calling thread for a spilled row (how long
  // each stays valid: row.h). NotFound on a miss; *out is empty after any
  // error.
  Status View(uint64_t id, RowView* out);
  // Copies rows ids[i] into rows[i], with statuses[i] as Get would return
  // (rows[i] is empty where statuses[i] is not OK). Spilled rows are read
  // by this process from the spill database, one RocksDB MultiGet per batch
  // (rows spilled after its last look at the database: one round trip to
  // the daemon for them all). Memory rows of a
  // batch are looked up with their cache misses overlapped (prefetching),
  // which is what a data loader's batch wants.
  // The returned Status is not OK only when the cache itself is unusable:
  // then every statuses[i] holds it too and every rows[i] is empty; or
  // InvalidArgument, with nothing written, when rows or statuses does not
  // hold ids.size() elements.
  Status GetBatch(std::span<const uint64_t> ids, std::span<Row> rows,
                  std::span<Status> statuses);
  // As GetBatch, but counts neither hits nor misses: for a reader whose
  // reads of these rows were counted already, as a loader reading back the
  // rows its worker processes computed and stored after its own read of
  // them missed (each read of a row is counted once).
  Status GetBatchUncounted(std::span<const uint64_t> ids, std::span<Row> rows,
                           std::span<Status> statuses);
  // Views of a batch, as View for each id, misses overlapped likewise, and
  // the returned Status as GetBatch's. Every view is of shared memory: a
  // spilled row gets statuses[i].IsNotSupported() and an empty views[i]
  // (read it with GetBatch or View).
  Status ViewBatch(std::span<const uint64_t> ids, std::span<RowView> views,
                   std::span<Status> statuses);
  // As ViewBatch, but counts neither hits nor misses (as GetBatchUncounted:
  // BatchReader's uncounted reads).
  Status ViewBatchUncounted(std::span<const uint64_t> ids, std::span<RowView> views,
                            std::span<Status> statuses);
  // Whether row `id` is cached, in memory or spilled. Counts neither a hit
  // nor a miss. False also when the cache is unusable (closed, its session
  // destroyed): it has no way to report an error; GetStats has.
  bool Contains(uint64_t id);

  // The counters of this cache, summed over every process that uses it
  // (stats.h). Errors: InvalidArgument once Close()d, NotFound once the
  // session was destroyed; *out is then unchanged.
  Status GetStats(CacheStats* out);
  // True once the cache takes no more rows, in memory or on disk
  // (CacheStats::full; see Put's Full).
  bool IsFull() const;
  // How many reads of this Cache object (in this process; a forked child
  // goes on from its parent's count) were answered RowDropped: spilled
  // rows that failed their check and were dropped (Get). A caller that
  // warns once compares it with the count it last saw.
  uint64_t SpilledRowsDropped() const;
  uint32_t cache_id() const;
  uint32_t session_id() const;

  // ---- Streaming caches: built by one pass over a source, then sealed.
  // One builder, over all processes of the session, claims the cache,
  // stores its rows under ids 0..n-1 and seals it with n; from then on
  // every pass reads the cache. Until it is sealed, readers stream from the
  // source. Claim and seal are rows above kMaxRowId, so they survive what
  // rows survive (a restart of the daemon, spilling to disk) and caches
  // sealed before Seal existed (by the Python package) read as sealed.
  // Thread safety: as Put.

  // Claims the build of this cache: *claimed is true for exactly one call
  // over all processes and the cache's lifetime (the first wins), false
  // for every other. Errors as Put; *claimed is false after one.
  Status ClaimBuild(bool* claimed);
  // Seals the cache as holding rows 0..num_rows-1. The first seal wins: a
  // later one returns OK and changes nothing. The caller stored those rows;
  // one that could not be stored (TooLarge) is a miss for readers, who
  // then go back to the source from it. Errors as Put (Full: the cache
  // stays unsealed).
  Status Seal(uint64_t num_rows);
  // OK and *num_rows (what Seal was given) once the cache is sealed;
  // NotFound while it is not; Corruption when the seal record is not one;
  // otherwise why the cache cannot be read (as Get). *num_rows is set only
  // on OK.
  Status GetSealedRows(uint64_t* num_rows);

  // Returns unused chunk space to the daemon. Further calls fail with
  // InvalidArgument. Also done by the destructor.
  void Close();

 private:
  // Get's halves. GetHit: copies row `id` into *out, counts the hit and
  // returns the copy's destination when it is a hit the single-row hit
  // path copies (in memory, under 2 KB, *out's buffer large enough, the
  // calling thread counting in this process's lane); nullptr, having done
  // nothing, otherwise. GetFull: the whole Get.
  const void* GetHit(uint64_t id, Row* out);
  Status GetFull(uint64_t id, Row* out);
  friend class Client;
  SHMCACHE_LOCAL explicit Cache(std::shared_ptr<CacheImpl> impl);
  std::shared_ptr<CacheImpl> impl_;
};

}  // namespace shmcache
