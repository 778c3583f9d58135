// Cache: one cache of one session, mapped into this process.
//
// Hits cost no system call: the index and rows live in shared memory mapped
// once per process. Writers bump-allocate inside chunks leased from the
// daemon and publish each row with one atomic store, so readers see a row
// whole or not at all.
//
// Thread safety: all methods may be called concurrently from any thread.
// After fork() the child may go on using the Cache.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "shmcache/row.h"
#include "shmcache/stats.h"
#include "shmcache/status.h"
#include "shmcache/types.h"

namespace shmcache {

class CacheImpl;

// Row ids of callers are at most kMaxRowId. The ids above it hold the
// cache's own records (ClaimBuild, Seal): a row put there is taken for one.
inline constexpr uint64_t kMaxRowId = ~uint64_t{0} - 16;

class Cache {
 public:
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // Stores row `id`. If the id is already present the new row is dropped and
  // OK is returned (the first writer wins); *inserted tells which happened.
  // One exception: a writer that stalls between claiming the id's index
  // slot and publishing it (descheduled or stopped for longer than the
  // bounded wait of a few thousand yields; see index_table.h) lets a second
  // writer of the same id store it too, and both are told they inserted.
  // Readers always see one whole row: the second copy until the first is
  // published, then the first. Rows of one id are expected to be equal.
  // When the memory budget is used up and the cache spills, the row goes to
  // disk through the daemon.
  // Full: the budget is used up and the cache does not spill, or spilling
  // failed (the cache turns read-only for everyone).
  // TooLarge: this row does not fit in the memory the cache has left (or in
  // its whole budget) while smaller rows still do: only this row is not
  // cached. A spilling cache sends such a row to disk instead, unless it is
  // larger than a spilled row may be (64 MB less 4 KB, encoded): then too it
  // is TooLarge, nothing was sent, and smaller rows are still accepted.
  // Unavailable: the daemon is gone and a new chunk was needed.
  // InvalidArgument: a column is malformed (sizes, names, too many).
  Status Put(uint64_t id, std::span<const ColumnRef> columns,
             bool* inserted = nullptr);
  // A row of one uint8 column named "data".
  Status Put(uint64_t id, const void* data, size_t nbytes,
             bool* inserted = nullptr);
  // Stores rows[i] under ids[i] for every i, as Put would one by one, but
  // takes the put lock once, looks the ids up with their memory misses
  // overlapped, and fills one leased chunk with as many rows as fit.
  // statuses[i] is what Put would return for row i, and inserted[i] (when
  // inserted is given) what Put would set. Rows are stored in order: of two
  // rows with one id in a batch, the first wins. Full and Unavailable end
  // the batch: the row that met one and every later row get that status,
  // and the rows before it stay stored. TooLarge and InvalidArgument
  // concern their row only; the rows after it are still stored.
  // REQUIRES: rows.size() == ids.size(); statuses (and inserted, when
  // given) hold ids.size() elements.
  // Returns OK unless the cache itself is unusable (closed, its session
  // destroyed); then every statuses[i] holds that status too and no row was
  // stored.
  // Thread safety: as Put; concurrent batches of one process are
  // serialised on the put lock, readers are never blocked.
  Status PutBatch(std::span<const uint64_t> ids,
                  std::span<const std::span<const ColumnRef>> rows,
                  Status* statuses, bool* inserted = nullptr);

  // Copies row `id` into *out. NotFound on a miss.
  Status Get(uint64_t id, Row* out);
  // Copies only the named columns, in the order given. NotFound on a miss or
  // when a named column is absent from the row (the message names it).
  Status Get(uint64_t id, std::span<const std::string_view> columns,
             Row* out);
  // A read-only view into shared memory; no copy. Valid while the session
  // exists and this Cache is open. A row spilled to disk has no shared
  // memory: its view points into a buffer of the calling thread, valid until
  // that thread's next View of a spilled row.
  Status View(uint64_t id, RowView* out);
  // Copies rows ids[i] into rows[i], with statuses[i] as Get would return.
  // Spilled rows are fetched from the daemon in one round trip per batch.
  // REQUIRES: rows and statuses hold ids.size() elements. The returned
  // Status is not OK only when the cache itself is unusable.
  // Memory rows of a batch are looked up with their cache misses
  // overlapped (prefetching), which is what a data loader's batch wants.
  Status GetBatch(std::span<const uint64_t> ids, Row* rows, Status* statuses);
  // Views of a batch, as View for each id, misses overlapped likewise. A
  // spilled row gets NotSupported (it has no shared memory): use GetBatch.
  Status ViewBatch(std::span<const uint64_t> ids, RowView* views, Status* statuses);
  bool Contains(uint64_t id);

  Status GetStats(CacheStats* out);
  // True once the cache stopped accepting rows (budget used up).
  bool IsFull() const;
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
  friend class Client;
  explicit Cache(std::shared_ptr<CacheImpl> impl);
  std::shared_ptr<CacheImpl> impl_;
};

}  // namespace shmcache
