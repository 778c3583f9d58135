// CacheState: the daemon's side of one cache: its files, its segments per
// NUMA node, the chunks leased to each connection, and the free tails of
// chunks given back.
//
// Chunk leasing is the only allocation: a client bump-allocates rows inside
// its chunk without talking to anyone. When it closes or dies (its
// connection ends), the part of each chunk past the chunk's `used` mark is
// recycled into a new chunk; a row killed mid-write is inside `used` and is
// the only space lost.
//
// One concept per file: cache_state.cc (creation, destruction, statistics),
// cache_state_index.cc, cache_state_budget.cc, cache_state_segments.cc,
// cache_state_chunks.cc, cache_state_spill.cc, cache_state_adoption.cc.
//
// Thread safety: none; the Store's mutex guards every call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "held_memory.h"
#include "index_table.h"
#include "instance.h"
#include "layout.h"
#include "memory_account.h"
#include "option_checks.h"
#include "shm_file.h"
#include "shmcache/stats.h"
#include "shmcache/status.h"

namespace shmcache {

class Logger;

// Making the next segment of a cache ahead of need, off the store's lock
// (posix_fallocate of hundreds of MB takes a while): TakeSegmentJob
// reserves the memory and names the file; the caller creates it with
// CreateSegmentFile and hands it back with FinishSegmentJob.
struct SegmentJob {
  uint32_t cache_id;
  uint32_t seg_no;
  int node;
  uint64_t size;
};

struct ChunkLease {
  uint32_t seg_no = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

class CacheState {
 public:
  static constexpr uint64_t kChunkBytes = 4u << 20;
  static constexpr uint64_t kMinRecycleBytes = 16u << 10;

  // Creates the header file and the first index table, reserving both in
  // `account`.
  static Status Create(const InstancePaths& paths, uint32_t cache_id, uint32_t session_id,
                       const std::string& name, const std::string& fingerprint,
                       uint64_t budget_bytes, bool spilling, int num_nodes,
                       MemoryAccount* account, Logger* log,
                       std::unique_ptr<CacheState>* out);
  // Re-opens a cache a previous daemon left in shared memory: its header,
  // the index tables the header names and the segments `seg_nos` (the
  // numbers found in the shm dir). Each file is opened only if it is ours
  // (ShmFile::Open) and validated (magic, layout version, sizes, ids); all
  // are reserved in `account`. A status that is not OK names the file that
  // could not be trusted; the caller then discards the cache's files.
  static Status Adopt(const InstancePaths& paths, uint32_t cache_id,
                      const std::set<uint32_t>& seg_nos, int num_nodes,
                      MemoryAccount* account, Logger* log,
                      std::unique_ptr<CacheState>* out);
  ~CacheState();

  // A chunk of at least `need` bytes of row space for connection `conn`.
  // Full when the budget or the server cap is used up (the cache is then
  // marked full for every client). TooLarge when only this row does not
  // fit: what is left still holds a segment of layout::kMinSegmentBytes, so the
  // cache is not marked and smaller rows go on being cached.
  // When the node's next segment is being prepared in the background and
  // `wait` is given, sets *wait instead of leasing: the caller waits for the
  // job to finish (FinishSegmentJob) and asks again. Without `wait` a
  // segment is made on the spot.
  Status Lease(uint64_t conn, int node, uint64_t need, MemoryAccount* account,
               ChunkLease* out, bool* wait = nullptr);
  // Takes back the unused tail of a chunk leased to `conn`.
  void Return(uint64_t conn, uint32_t seg_no, uint64_t offset);
  // The connection ended. recycle: its process is gone, so the unused
  // tails of its chunks are free again; otherwise (a live process whose
  // connection broke may still write into them) they are only forgotten.
  void ReleaseConnection(uint64_t conn, bool recycle = true);
  // Adds an index table unless one was added since the client saw `seen`.
  Status GrowIndex(uint32_t seen, MemoryAccount* account);
  // Marks the cache destroyed, unlinks its files, releases its memory.
  // With `held`, the files' identities and sizes are appended there and
  // their bytes stay reserved in `account`: processes may still map them,
  // and the caller releases each once none does (HeldMemory).
  void Destroy(MemoryAccount* account, std::vector<HeldFile>* held = nullptr);
  // A cache that the server's cap (not its budget) made full takes rows
  // again once the cap has room for a segment. True when it resumed.
  bool ResumeIfCapAllows(const MemoryAccount& account);

  // True when the cache takes rows on disk (layout::SpillingOn). Clients
  // send rows there once memory is used up, and a row too large for the
  // memory left at any time.
  bool spilling() const;
  // Publishes row `row_id` (`bytes` encoded) as spilled, after it was
  // written to disk. *inserted false when the id was already present.
  Status PublishSpilled(uint64_t row_id, uint64_t bytes, MemoryAccount* account,
                        bool* inserted);
  // Counts rows read back from the spill store (for the statistics).
  void CountSpillReads(uint64_t n) { spill_reads_ += n; }
  // Spilling is off from now on (it failed: disk full, RocksDB error; or a
  // restarted server has no spill store). Once memory is used up too, the
  // cache is full: no more rows are accepted.
  void StopSpilling(const std::string& why);
  // Withdraws every spilled row from the index (their spill store cannot
  // serve them): they read as misses and can be put again. Returns how many;
  // the disk_rows statistic starts again from 0.
  uint64_t DropSpilledRows();
  // True when rows go to disk once memory is used up.
  bool spill_enabled() const;
  // "cache 3 (session 7, 'name')", for messages.
  std::string Label() const;
  bool destroyed() const { return destroyed_; }

  // A job when the current segment of `node` is half carved and nothing is
  // prepared yet.
  std::optional<SegmentJob> TakeSegmentJob(int node, MemoryAccount* account);
  void FinishSegmentJob(const SegmentJob& job, const Status& made, ShmFile file,
                        MemoryAccount* account);
  // Creates and formats a segment file. Thread-safe (touches no state).
  static Status CreateSegmentFile(const InstancePaths& paths, uint32_t cache_id,
                                  uint32_t seg_no, int node, uint64_t size, ShmFile* out);

  // ReadCacheStats of the header, with the spill reads this daemon served.
  CacheStats Stats() const;
  uint32_t session_id() const { return session_id_; }
  const std::string& name() const { return name_; }
  const std::string& fingerprint() const { return fingerprint_; }
  uint64_t reserved_bytes() const { return reserved_bytes_; }
  // Whether index table file (gen, tag) is one this cache uses.
  bool UsesTable(uint32_t gen, uint32_t tag) const;

 private:
  struct Segment {
    uint32_t seg_no;
    int node;
    uint64_t size;
    uint64_t carved;
    ShmFile file;
  };
  struct Tail {
    uint32_t seg_no;
    uint64_t offset;
    uint64_t size;
  };

  struct Prepared {
    uint32_t seg_no;
    uint64_t size;
    ShmFile file;
  };

  CacheState(const InstancePaths& paths, uint32_t cache_id, int num_nodes, Logger* log);
  // Size of the next segment, at least min_bytes; 0 when the budget or the
  // cap leaves less.
  uint64_t NextSegmentSize(uint64_t min_bytes, const MemoryAccount& account) const;
  uint64_t BudgetLeft() const;
  // No segment of min_bytes fits: TooLarge when an ordinary segment still
  // would, else the cache's memory is used up (see MemoryUsedUp).
  Status NoRoomFor(uint64_t chunk_bytes, uint64_t min_bytes,
                   const MemoryAccount& account);
  // Spilling caches send further rows to disk, others stop taking rows.
  // by_cap: the server's cap ran out, not the budget (ResumeIfCapAllows).
  Status MemoryUsedUp(const std::string& why, bool by_cap);
  // Records that the cap set `bits`: ResumeIfCapAllows clears them, and
  // readers see kStateByCap (a refused put names the cap, not the budget).
  void MarkByCap(uint32_t bits);
  static constexpr uint64_t AlignUp(uint64_t n, uint64_t a) {
    return (n + a - 1) / a * a;
  }
  // Unlinks `path`; with `held`, records it there first. Returns the bytes
  // recorded.
  static uint64_t UnlinkFile(const std::string& path, uint64_t bytes,
                             std::vector<HeldFile>* held);
  void AddSegment(uint32_t seg_no, int node, uint64_t size, ShmFile file);
  Status NewSegment(int node, uint64_t need, MemoryAccount* account, Segment** out,
                    bool* wait);
  // Creates and formats a segment under the first free number from
  // next_seg_no_ on, and moves next_seg_no_ past it.
  Status CreateNextSegment(int node, uint64_t size, uint32_t* seg_no, ShmFile* out);
  static void FormatSegment(ShmFile* f, uint32_t cache_id, uint32_t seg_no, int node,
                            uint64_t size);
  std::string TablePath(uint32_t gen) const;
  // Adopt's steps; each adds what it maps to reserved_bytes_.
  Status AdoptHeader();
  Status AdoptTable(uint32_t gen);
  Status AdoptSegment(uint32_t seg_no);
  Status CreateTable(uint32_t gen, uint32_t capacity_log2, MemoryAccount* account);
  layout::ChunkHeader* ChunkAt(uint32_t seg_no, uint64_t offset, uint64_t size);
  void MarkFull(const std::string& why);
  void AddReserved(uint64_t n);

  InstancePaths paths_;
  Logger* log_ = nullptr;
  uint32_t cache_id_ = 0;
  uint32_t session_id_ = 0;
  std::string name_;
  std::string fingerprint_;
  uint64_t budget_bytes_ = 0;
  uint64_t data_bytes_ = 0;      // segments, counted against the budget
  uint64_t reserved_bytes_ = 0;  // everything, counted against the cap
  int num_nodes_ = 1;
  bool destroyed_ = false;
  uint32_t cap_full_bits_ = 0;  // state bits set because the cap ran out
  ShmFile header_file_;
  layout::CacheHeader* header_ = nullptr;
  std::vector<ShmFile> tables_;
  std::vector<IndexTable> index_;         // over tables_
  std::map<uint32_t, Segment> segments_;  // by seg_no
  uint32_t next_seg_no_ = 0;
  std::vector<std::optional<Prepared>> prepared_;       // per node: next segment
  std::vector<bool> preparing_;                         // per node: job running
  std::vector<int> current_;                            // per node: seg_no or -1
  std::vector<std::vector<Tail>> tails_;                // per node
  std::map<uint64_t, std::vector<ChunkLease>> leases_;  // by connection
  uint64_t spill_reads_ = 0;                            // since this daemon started
};

}  // namespace shmcache
