// ChunkWriter: this process's writes of rows into a cache's shared memory.
//
// The daemon leases the process chunks of a segment, one per NUMA node; the
// writer encodes each row at the end of the chunk of the calling thread's
// node and publishes it with one insert into the index (the commit point:
// the row is visible whole or not at all). A row that does not fit makes it
// lease a new chunk, handing the old one's unused tail back in the same
// request; a full index table makes it ask the daemon to grow the index.
//
// On a tmpfs of 4 KB pages (WritesThroughFd) the daemon leaves a segment's
// pages uncleared, and a batch's rows are written through the segment's
// descriptor instead of its mapping: one pwritev per window of rows, whole
// pages that the kernel need not clear, and only then published (Publish).
// A single Put of a small row still copies through the mapping, into a
// chunk cleared and mapped when it was leased for it (a chunk a batch or a
// large row leased is cleared by the single Put's write faults); a single
// Put of a large row (kLargeRowBytes) is written through the descriptor at
// once. A page of a chunk that nobody wrote reads as zero either way.
//
// Writes take the writer's mutex (process-local, fork-safe, LockRank::
// kCachePut), once per batch: it is held through the daemon round trips of
// a lease. A killed process takes it with it; the daemon takes back the
// chunks of a process that is gone. A forked child never writes into its
// parent's chunks: it leases its own.
//
// Thread safety: every method from any thread.
#pragma once

#include <sys/uio.h>

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
    // For a batch of `rows` rows (more than one) whose outcomes go to
    // statuses[i] and, when given, inserted[i]: rows may be deferred (see
    // Write) and their outcomes set by Publish.
    BatchLock(ChunkWriter* writer, size_t rows, Status* statuses, bool* inserted)
        : lock_(writer->mu_, std::defer_lock),
          statuses_(rows > 1 ? statuses : nullptr),
          inserted_(inserted) {}
    // The batch's row the next Write writes.
    void AtRow(size_t row) { row_ = row; }
    // Whether a Publish met Full or Unavailable (growing the index), which
    // ends the batch at row ended_at(): that row and every later one get
    // ended_status() (the caller sets those not published: Publish set the
    // deferred ones), and no row from there on is stored.
    bool ended() const { return ended_; }
    size_t ended_at() const { return ended_at_; }
    const Status& ended_status() const { return ended_status_; }
    // Lets the mutex go before the batch ends (its rows to disk are put
    // without it); a later Write takes it again.
    void Unlock() {
      if (lock_.owns_lock()) lock_.unlock();
    }

   private:
    friend class ChunkWriter;
    std::unique_lock<ForkSafeMutex> lock_;
    std::chrono::steady_clock::time_point asked_;  // when the batch asked for it
    Status* const statuses_ = nullptr;             // null: no row is deferred
    bool* const inserted_ = nullptr;
    size_t row_ = 0;
    // The segment whose descriptor the batch found its own, within the
    // file size limit up to this end (WriteDeferred).
    const MappedSegment* fd_checked_ = nullptr;
    uint64_t fd_checked_end_ = 0;
    bool ended_ = false;
    size_t ended_at_ = 0;
    Status ended_status_;
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
  // Rows put alone of kLargeRowBytes or more (a CachedLoader worker puts
  // each row it computes) go through the descriptor at once, where there is
  // one: a chunk leased for them is neither cleared nor mapped.
  // Deferred rows: in a batch whose lock was given its outcomes, a row for
  // a chunk written through its descriptor is reserved and queued, and
  // Write returns OK with *inserted false; Publish writes and publishes it
  // and sets its outcome (as Write would have: the first row of an id
  // wins, a queued one included). The queued rows are published before a
  // lease and before a row is written through the mapping.
  Status Write(uint64_t id, std::span<const ColumnRef> columns, size_t size,
               BatchLock* lock, Tally* tally, bool* inserted, bool* lease_failed,
               const Status* refusal = nullptr);
  // Writes the deferred rows of *lock's batch (one pwritev per IOV_MAX
  // pieces; through the mapping should the descriptor fail) and then
  // publishes them in order, setting each one's outcome. A Full or
  // Unavailable answer to growing the index ends the batch (BatchLock::
  // ended); the rows queued from there on are not published and their
  // room is taken back. Returns false when the batch has ended. The caller
  // publishes before it lets the lock go.
  bool Publish(BatchLock* lock, Tally* tally);
  // Asks the daemon for an index table past the `seen` ones mapped, and
  // maps it.
  Status GrowIndex(uint32_t seen);
  // For a row TableSet::Publish left behind (kBehind, *tables `tables`):
  // grows the index and republishes it until it is in the newest table.
  // The row counts as published whatever this returns: OK also where the
  // daemon answered Full or Unavailable (the row may then read as a miss);
  // a table that cannot be mapped, or another answer, is returned.
  Status CarryForward(uint64_t id, uint64_t loc, uint32_t tables);
  // Hands the chunks' unused tails back to the daemon (the cache is being
  // closed); a forked child has none of its own. Waits at most
  // protocol::kReturnChunkTimeoutMs for each answer. No Write leases or
  // writes after it: a put that checked the cache before the close and
  // reaches the writer after it would lease a chunk nobody returns.
  void ReturnChunks() EXCLUDES(mu_);

 private:
  // From this size a row put alone is written through the descriptor: one
  // pwritev copies it into pages the kernel need not clear, where the
  // mapping costs clearing the chunk's pages, a populate or a fault per
  // page and their unmapping. The writer's CPU per row alone, mapping ->
  // descriptor (3 rounds): 64 KB 28.5-30.2 -> 19.5-20.1 us, 150 KB
  // 59.7-60.4 -> 38.3-45.4 us, 588 KB 210-240 -> 144-158 us. Below it the
  // call costs more than the clearing it saves (3 KB rows: one pwrite per
  // Put 1.0-1.36x the CPU of the mapping).
  static constexpr size_t kLargeRowBytes = 64 << 10;

  struct Chunk {
    uint32_t seg_no = 0;
    uint64_t offset = 0;   // of the chunk inside its segment
    char* base = nullptr;  // chunk start
    uint64_t size = 0;
    uint64_t used = 0;
    layout::ChunkHeader* header = nullptr;
    int fd = -1;  // its segment's, when rows are written through it
    const MappedSegment* seg = nullptr;
  };
  // A row reserved in the chunk and not yet written (Write's deferred rows).
  struct Deferred {
    uint64_t id;
    std::span<const ColumnRef> columns;
    uint64_t size;
    uint64_t off;  // in the chunk
    size_t row;    // in the batch
  };

  // Takes mu_ unless *lock holds it; a forked child first drops the
  // chunks, which belong to its parent. On return mu_ is held (by *lock),
  // which the analysis cannot follow through the unique_lock: asserted.
  void Lock(BatchLock* lock) ASSERT_CAPABILITY(mu_);
  // A new chunk with room for `need` bytes on `node` in place of *c;
  // `mapped`: for rows written through the mapping (not deferred).
  Status Lease(int node, size_t need, Chunk* c, bool mapped) REQUIRES(mu_);
  // Moves the chunk's `used` mark from c->used to `to` (compare-and-swap:
  // the daemon may take back the chunk's end, layout::kRoomTaken), taking
  // in the end the daemon set. False, with the mark where it was, when `to`
  // lies past the chunk's end then.
  static bool MoveUsed(Chunk* c, uint64_t to);
  // Puts the bytes of the deferred rows of chunk `c` in place: through
  // its descriptor, or through the mapping where the descriptor fails, no
  // longer names the segment, or the process's file size limit lies below
  // the chunk's end (then `c` is written through the mapping from there
  // on). *lock's batch checks the last two once per chunk.
  void WriteDeferred(Chunk* c, BatchLock* lock) REQUIRES(mu_);
  // The mapping's way of WriteDeferred.
  void EncodeDeferred(const Chunk& c) REQUIRES(mu_);
  // Publishes a row written at chunk offset `off` of `c`; on kExists (or
  // an error before the row was published) gives its room back when it is
  // the chunk's last row. A row published behind the newest table is
  // carried forward (CarryForward), *inserted true whatever that returns.
  Status Insert(uint64_t id, uint64_t size, uint64_t off, Chunk* c, Tally* tally,
                bool* inserted) REQUIRES(mu_);

  const std::shared_ptr<ClientImpl> client_;
  const uint32_t cache_id_;
  SegmentSet* const segments_;
  TableSet* const tables_;
  StatsLanes* const stats_;
  ForkSafeMutex mu_{LockRank::kCachePut};
  std::vector<Chunk> chunks_ GUARDED_BY(mu_);  // one per NUMA node
  // The batch's deferred rows, all in chunks_[deferred_node_]; with the
  // pieces of their pwritev (kept for their buffers).
  std::vector<Deferred> deferred_ GUARDED_BY(mu_);
  size_t deferred_node_ GUARDED_BY(mu_) = 0;
  std::vector<std::byte> heads_ GUARDED_BY(mu_);
  std::vector<struct iovec> pieces_ GUARDED_BY(mu_);
  uint64_t fork_gen_ GUARDED_BY(mu_) = 0;  // of the process chunks_ are for
  bool closed_ GUARDED_BY(mu_) = false;    // ReturnChunks ran
  bool refused_ GUARDED_BY(mu_) = false;   // a refusal was given (see Write)
  // When a lease last got no answer (Unavailable). A batch that asked for
  // mu_ before then gets that answer too rather than asking again: the put
  // lock is held through a lease, and each put is to wait the request
  // timeout once, not once for every batch queued before it.
  std::chrono::steady_clock::time_point unanswered_at_ GUARDED_BY(mu_);
};

}  // namespace shmcache
