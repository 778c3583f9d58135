// SpillStage: how this process puts rows that go to disk. The rows are
// encoded straight into a staging file the daemon made for this
// connection and cache (protocol.h, kSpillStage), and one request carries
// only their ids and sizes (kSpillPutStaged); the daemon copies them into
// one RocksDB write batch, checks the copy and writes it, and publishes each
// row in the index. No row crosses the socket, and a batch of rows costs one
// round trip and one disk write per kRequestBytes of rows, not one per row.
// Only the daemon writes RocksDB.
//
// A row is visible whole or not at all: the index points to it only after
// the batch holding it was written. A writer killed while staging sent
// nothing; its stage goes with its connection. A stage whose request got no
// answer is never written again (the daemon may be reading it still).
//
// Thread safety: Put may be called from any thread; the stage is used by
// one at a time (a mutex, fork-safe). After fork() the child asks for a
// stage of its own (the parent's belongs to the parent's connection).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "format/shm_file.h"
#include "lib/client_impl.h"
#include "lib/fork_safety.h"
#include "shmcache/row.h"
#include "shmcache/status.h"

namespace shmcache {

class SpillStage {
 public:
  // A row that goes to disk: its id, columns, encoded size (RowCodec,
  // at most protocol::kMaxSpilledRowBytes) and its position in the caller's
  // batch.
  struct Row {
    uint64_t id;
    std::span<const ColumnRef> columns;
    size_t size;
    size_t index;
  };

  // Writes rows[0..*done) through the stage: statuses[index] is OK (with
  // inserted[index] false when the id was cached already) or why not (Full
  // when the cache stopped spilling; the transport's error). Returns what
  // kept it from staging rows[*done] and those after it when *done <
  // rows.size() (no stage could be had: no room in the shm dir); the caller
  // then puts them another way.
  Status Put(ClientImpl* client, uint32_t cache_id, std::span<const Row> rows,
             Status* statuses, bool* inserted, size_t* done) EXCLUDES(mu_);

 private:
  // The most bytes of rows one request carries (a larger row goes alone).
  // The daemon passes a request's rows four times (copy out of the stage,
  // check, write-ahead log, memtable): rows of 1 MB a request stay in the
  // CPU's caches through those, rows of a whole 8 MB stage do not. Measured
  // here, batches of 64 rows of 150 KB and 1 MB went 1.2-1.5x faster with
  // 1 MB requests than with whole stages (docs/spill-reads.md); 3 KB
  // batches (192 KB) are one request either way.
  static constexpr size_t kRequestBytes = 1u << 20;

  // Maps a stage of at least min_bytes for this connection and cache.
  Status Acquire(ClientImpl* client, uint32_t cache_id, uint64_t min_bytes) REQUIRES(mu_);

  ForkSafeMutex mu_{LockRank::kSpillStage};
  uint64_t fork_gen_ GUARDED_BY(mu_) = 0;
  uint32_t tag_ GUARDED_BY(mu_) = 0;
  ShmFile file_ GUARDED_BY(mu_);  // unmapped: none yet
};

}  // namespace shmcache
