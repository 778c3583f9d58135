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

class Cache {
 public:
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // Stores row `id`. If the id is already present the new row is dropped and
  // OK is returned (the first writer wins); *inserted tells which happened.
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

  // Returns unused chunk space to the daemon. Further calls fail with
  // InvalidArgument. Also done by the destructor.
  void Close();

 private:
  friend class Client;
  explicit Cache(std::shared_ptr<CacheImpl> impl);
  std::shared_ptr<CacheImpl> impl_;
};

}  // namespace shmcache
