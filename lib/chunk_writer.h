// ChunkWriter: this process's writes of rows into a cache's shared memory.
//
// The daemon leases the process chunks of a segment, one per NUMA node; the
// writer encodes each row at the end of the chunk of the calling thread's
// node and publishes it with one insert into the index (the commit point:
// the row is visible whole or not at all). A row that does not fit makes it
// lease a new chunk, handing the old one's unused tail back in the same
// request; a full index table makes it ask the daemon to grow the index.
//
// Writes take the writer's mutex (process-local, fork-safe, LockRank::
// kCachePut), once per batch: it is held through the daemon round trips of
// a lease. A killed process takes it with it; the daemon takes back the
// chunks of a process that is gone. A forked child never writes into its
// parent's chunks: it leases its own.
//
// Thread safety: every method from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "format/layout.h"
#include "lib/client_impl.h"
#include "lib/fork_safety.h"
#include "lib/segment_set.h"
#include "lib/stats_lanes.h"
#include "lib/table_set.h"
#include "shmcache/status.h"
#include "shmcache/types.h"

namespace shmcache {

class ChunkWriter {
 public:
  // Writes for cache `cache_id` through `client`, into segments mapped in
  // `segments` and an index mapped in `tables` (both outlive the writer),
  // with one chunk per NUMA node of `num_nodes`. With `stats` (outlives
  // the writer too), the rows a Tally holds are counted there before a
  // lease: the daemon weighs a row it has no room for against the size of
  // the rows counted (SegmentAllocator::NoRoomFor).
  ChunkWriter(std::shared_ptr<ClientImpl> client, uint32_t cache_id, int num_nodes,
              SegmentSet* segments, TableSet* tables, StatsLanes* stats = nullptr);
  ChunkWriter(const ChunkWriter&) = delete;
  ChunkWriter& operator=(const ChunkWriter&) = delete;

  // Rows a Write published and their encoded bytes, for the caller to count
  // into the statistics.
  struct Tally {
    uint64_t rows = 0;
    uint64_t bytes = 0;
  };
  // The writer's mutex for one batch of puts: taken by the batch's first
  // Write, held until the batch ends (a batch that writes nothing to memory
  // never takes it).
  class BatchLock {
   public:
    explicit BatchLock(ChunkWriter* writer) : lock_(writer->mu_, std::defer_lock) {}
    // Lets the mutex go before the batch ends (its rows to disk are put
    // without it); a later Write takes it again.
    void Unlock() {
      if (lock_.owns_lock()) lock_.unlock();
    }

   private:
    friend class ChunkWriter;
    std::unique_lock<ForkSafeMutex> lock_;
    std::chrono::steady_clock::time_point asked_;  // when the batch asked for it
  };

  // Writes row `id` (`columns`, `size` bytes encoded: RowCodec::
  // EncodedSize) and publishes it. OK with *inserted false when the id was
  // published already (by this process or another): the first row wins.
  // InvalidArgument once ReturnChunks ran (the cache was closed while the
  // caller's batch was on its way here): nothing is leased or written.
  // Errors: the daemon's answer to a lease (Full, FullServerCap, TooLarge,
  // Unavailable...: *lease_failed is then true and the chunks are as they
  // were, but for a chunk traded in for a lease that got no readable
  // answer: Unavailable or Corruption, after which it is never written
  // again), or to growing the index.
  // With a `refusal` (the cache is full: it leases no more chunks), a row
  // that the chunk held does not fit gets that refusal, with *lease_failed
  // true, and the daemon is not asked, and so does every later row while
  // the cache stays full (full stays full for a writer, on any node), as
  // after a row whose lease the daemon refused as Full; one that fits
  // before is written as ever (the room is this process's, counted against
  // the budget already).
  Status Write(uint64_t id, std::span<const ColumnRef> columns, size_t size,
               BatchLock* lock, Tally* tally, bool* inserted, bool* lease_failed,
               const Status* refusal = nullptr);
  // Asks the daemon for an index table past the `seen` ones mapped, and
  // maps it.
  Status GrowIndex(uint32_t seen);
  // Hands the chunks' unused tails back to the daemon (the cache is being
  // closed); a forked child has none of its own. Waits at most
  // protocol::kReturnChunkTimeoutMs for each answer. No Write leases or
  // writes after it: a put that checked the cache before the close and
  // reaches the writer after it would lease a chunk nobody returns.
  void ReturnChunks() EXCLUDES(mu_);

 private:
  struct Chunk {
    uint32_t seg_no = 0;
    uint64_t offset = 0;   // of the chunk inside its segment
    char* base = nullptr;  // chunk start
    uint64_t size = 0;
    uint64_t used = 0;
    layout::ChunkHeader* header = nullptr;
  };

  // Takes mu_ unless *lock holds it; a forked child first drops the
  // chunks, which belong to its parent. On return mu_ is held (by *lock),
  // which the analysis cannot follow through the unique_lock: asserted.
  void Lock(BatchLock* lock) ASSERT_CAPABILITY(mu_);
  // A new chunk with room for `need` bytes on `node` in place of *c.
  Status Lease(int node, size_t need, Chunk* c) REQUIRES(mu_);
  // Moves the chunk's `used` mark from c->used to `to` (compare-and-swap:
  // the daemon may take back the chunk's end, layout::kRoomTaken), taking
  // in the end the daemon set. False, with the mark where it was, when `to`
  // lies past the chunk's end then.
  static bool MoveUsed(Chunk* c, uint64_t to);

  const std::shared_ptr<ClientImpl> client_;
  const uint32_t cache_id_;
  SegmentSet* const segments_;
  TableSet* const tables_;
  StatsLanes* const stats_;
  ForkSafeMutex mu_{LockRank::kCachePut};
  std::vector<Chunk> chunks_ GUARDED_BY(mu_);  // one per NUMA node
  uint64_t fork_gen_ GUARDED_BY(mu_) = 0;      // of the process chunks_ are for
  bool closed_ GUARDED_BY(mu_) = false;        // ReturnChunks ran
  bool refused_ GUARDED_BY(mu_) = false;       // a refusal was given (see Write)
  // When a lease last got no answer (Unavailable). A batch that asked for
  // mu_ before then gets that answer too rather than asking again: the put
  // lock is held through a lease, and each put is to wait the request
  // timeout once, not once for every batch queued before it.
  std::chrono::steady_clock::time_point unanswered_at_ GUARDED_BY(mu_);
};

}  // namespace shmcache
