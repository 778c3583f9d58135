// CacheState: the daemon's side of one cache: its header file (its name,
// fingerprint, state and statistics as every client reads them), its index
// tables, its spilled rows' index entries, and its SegmentAllocator, which
// owns the cache's row memory (segments per NUMA node, chunks leased to
// each connection, tails recycled, the budget).
//
// Files: cache_state.cc (creation, adoption, destruction, statistics),
// cache_state_index.cc, cache_state_spill.cc; the allocator's in
// segment_allocator.cc.
//
// Thread safety: none; the Store's mutex guards every call.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "daemon/held_memory.h"
#include "daemon/memory_account.h"
#include "daemon/segment_allocator.h"
#include "format/index_table.h"
#include "format/instance.h"
#include "format/layout.h"
#include "format/shm_file.h"
#include "shmcache/stats.h"
#include "shmcache/status.h"

namespace shmcache {

class Logger;

class CacheState {
 public:
  // Creates the header file and the first index table, reserving both in
  // `account`.
  static Status Create(const InstancePaths& paths, uint32_t cache_id, uint32_t session_id,
                       const std::string& name, const std::string& fingerprint,
                       uint64_t budget_bytes, bool spill_requested, int num_nodes,
                       MemoryAccount* account, Logger* log,
                       std::unique_ptr<CacheState>* out);
  // Re-opens a cache a previous daemon left in shared memory: its header,
  // the index tables the header names and the segments `seg_nos` (the
  // numbers found in the shm dir; SegmentAllocator::AdoptSegment). Each
  // file is opened only if it is ours (ShmFile::Open) and validated (magic,
  // layout version, sizes, ids); all are reserved in `account`. A status
  // that is not OK names the file that could not be trusted; the caller
  // then discards the cache's files.
  static Status Adopt(const InstancePaths& paths, uint32_t cache_id,
                      const std::set<uint32_t>& seg_nos, int num_nodes,
                      MemoryAccount* account, Logger* log,
                      std::unique_ptr<CacheState>* out);
  ~CacheState();

  // The allocator's (SegmentAllocator says what each does), keeping the
  // header's reserved_bytes up to date.
  Status Lease(uint64_t conn, int node, uint64_t need, MemoryAccount* account,
               ChunkLease* out, bool* wait = nullptr);
  void Return(uint64_t conn, uint32_t seg_no, uint64_t offset);
  void ReleaseConnection(uint64_t conn, bool recycle = true);
  // Adds an index table unless one was added since the client saw `seen`:
  // the steps below, in one call (the spill path's, under the lock).
  Status GrowIndex(uint32_t seen, MemoryAccount* account);

  // An index growth in steps, so that the store's lock is let go while the
  // new table's file is made and its pages cleared and mapped, and again
  // while the older tables' slots are freed (Store::GrowIndex): under the
  // lock BeginGrowth, without it MakeTable, under it FinishGrowth, without
  // it FreeCompacted, under it EndGrowth. growing() is true from
  // BeginGrowth to EndGrowth: another growth of this cache waits for that
  // (the copy of one would miss what the other adds), and so must its
  // destruction (the steps without the lock use its mappings).
  struct Growth {
    uint32_t gen = 0;    // the new table's generation
    uint32_t log2 = 0;   // of its slots
    uint64_t bytes = 0;  // its file's, reserved by BeginGrowth
    // Set by FinishGrowth: the older tables whose slots FreeCompacted frees
    // (their mappings), and the bytes EndGrowth then releases.
    std::vector<std::span<char>> to_free;
    uint64_t freed = 0;
    int free_errno = 0;  // FreeCompacted's first failure, logged by EndGrowth
    // Where a growth that threw stands (Store::GrowIndex ends what is
    // left): FinishGrowth settled the reserved bytes (the new table's, or
    // released); EndGrowth ended it. Each step sets its flag once its state
    // changed, and leaves nothing changed when it throws before.
    bool finished = false;
    bool ended = false;
  };
  // Reserves the table that follows `seen` in `account`; *needed false
  // when one was added since (OK, nothing reserved). The errors are
  // GrowIndex's: its largest size, the cap used up (the cache marked full).
  Status BeginGrowth(uint32_t seen, MemoryAccount* account, Growth* g, bool* needed);
  // Creates the table file of `g` under a fresh random tag (*tag), its
  // pages reserved, cleared and mapped in this process, and formats its
  // header. Without the lock: nothing names it until FinishGrowth; a
  // daemon killed before leaves a file the adopting one removes.
  static Status MakeTable(const InstancePaths& paths, uint32_t cache_id, const Growth& g,
                          ShmFile* file, uint32_t* tag, std::string* skipped);
  // Publishes the table MakeTable `made` and copies the older tables into
  // it (CompactIndex, filling g->to_free). When it failed, or a table of
  // that generation was added meanwhile (a GrowIndex in one call, which
  // the store keeps out of a growth in steps: Store::CacheNotGrowing), the
  // file is removed and its bytes released; a failure is returned as
  // GrowIndex returns it. A throw (an allocation) leaves g->finished false
  // and the table not added; after it is added (g->finished), the older
  // tables are at worst not compacted, which lookups allow.
  Status FinishGrowth(Growth* g, const Status& made, ShmFile file, uint32_t tag,
                      MemoryAccount* account);
  // Frees the slots of the tables FinishGrowth compacted away (MADV_REMOVE
  // of their pages past the first). Without the lock; thread-safe with
  // readers and writers, which read freed slots as empty.
  static void FreeCompacted(Growth* g);
  // Releases the bytes FreeCompacted freed and ends the growth; called
  // once for each BeginGrowth that set *needed, whatever FinishGrowth said
  // (g->ended then; a failed free is logged after).
  void EndGrowth(Growth* g, MemoryAccount* account);
  // A growth is between BeginGrowth and EndGrowth. What may grow the index
  // under the lock (the spill path's GrowIndex) waits for it to end: inside
  // it, it would reserve a second table of the same generation.
  bool growing() const { return growing_ != 0; }
  // Marks the cache destroyed, unlinks its files, releases its memory.
  // With `held`, the files' identities and sizes are appended there and
  // their bytes stay reserved in `account`: processes may still map them,
  // and the caller releases each once none does (HeldMemory).
  void Destroy(MemoryAccount* account, std::vector<HeldFile>* held = nullptr);
  bool ResumeIfCapAllows(const MemoryAccount& account);
  // A later open asked for a budget of `bytes`: a larger one replaces the
  // cache's (SegmentAllocator::RaiseBudget). True when it was raised.
  bool RaiseBudget(uint64_t bytes);

  // True when the cache takes rows on disk (layout::SpillingOn: spilling
  // enabled and the cache not full). Clients send rows there once memory is
  // used up, and a row too large for the memory left at any time.
  bool spilling_on() const;
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
  // Withdraws spilled row `row_id` from the index (it failed its check on
  // disk, Store::SpillGet): it reads as a miss and a put stores it again.
  // `bytes`: its size as stored, 0 when unknown (then the spilled rows'
  // mean leaves disk_bytes). False when the index holds no spilled row of
  // that id (dropped already).
  bool DropSpilledRow(uint64_t row_id, uint64_t bytes);
  // True when spilling was requested and has not stopped
  // (layout::kStateSpillEnabled), full or not.
  bool spill_enabled() const;
  // A later open asked for spilling (spill_requested) of a cache made
  // without it: spilling is enabled, and a cache that was full takes rows
  // again (its next row past memory goes to disk). Not where spilling
  // stopped in this server's life (StopSpilling: a disk error). True when
  // it was enabled.
  bool RequestSpilling();
  // "cache 3 (session 7, 'name')", for messages.
  std::string Label() const;
  bool destroyed() const { return destroyed_; }

  std::vector<SegmentJob> TakeSegmentJobs(int node, MemoryAccount* account, int max_jobs);
  std::vector<SegmentJob> TakeSupplyJobs(int node) { return alloc_.TakeSupplyJobs(node); }
  void FinishSegmentJob(const SegmentJob& job, const Status& made, ShmFile file,
                        MemoryAccount* account);

  // ReadCacheStats of the header, with the spill reads this daemon served.
  CacheStats Stats() const;
  uint32_t session_id() const { return session_id_; }
  const std::string& name() const { return name_; }
  const std::string& fingerprint() const { return fingerprint_; }
  // Everything, counted against the cap: its files and its segments.
  uint64_t reserved_bytes() const { return file_bytes_ + alloc_.data_bytes(); }
  // Whether index table file (gen, tag) is one this cache uses.
  bool UsesTable(uint32_t gen, uint32_t tag) const;

 private:
  CacheState(const InstancePaths& paths, uint32_t cache_id, int num_nodes, Logger* log);
  std::string TablePath(uint32_t gen) const;
  // Adopt's steps; each adds what it maps to file_bytes_.
  Status AdoptHeader();
  Status AdoptTable(uint32_t gen);
  Status CreateTable(uint32_t gen, uint32_t capacity_log2, MemoryAccount* account);
  // Adds table `gen` (made, formatted, its bytes reserved) to index_ and
  // publishes it in the header; throwing (no room in index_ or tables_),
  // adds nothing.
  void InstallTable(uint32_t gen, ShmFile file, uint32_t tag);
  // Copies the rows of the tables from first_table on into the newest
  // (just made) one and raises first_table to it; the older tables' slots
  // are then to be freed (g->to_free) and their bytes released (g->freed)
  // (cache_state_index.cc).
  void CompactIndex(Growth* g);
  // Frees the slots of table g, which lookups no longer probe (below
  // first_table): its pages past the first go back to the system and the
  // first page's slots are emptied; the header stays. Idempotent.
  void FreeTableSlots(uint32_t g);
  // FreeTableSlots of a table's mapping; the errno of a failed madvise, or
  // 0. Thread-safe.
  static int FreeSlots(std::span<char> table);
  // The cache marked full where growth `g` failed for want of room
  // (`why`); returns `why`.
  Status GrowthFailed(const Growth& g, const Status& why, MemoryAccount* account);
  // FullServerCap: an index table's bytes could not be reserved.
  Status IndexCapUsedUp() const;
  // The tables lookups probe: from first_table on (the older ones' slots
  // are freed; touching them would bring their pages back).
  std::span<IndexTable> LiveIndex();
  // Bytes of table g counted against the cap: one page once it was
  // compacted away (its header stays), the whole file before.
  uint64_t TableBytes(uint32_t g) const;
  // Adds n bytes of its own files to what it reserves.
  void AddReserved(uint64_t n);
  // Publishes reserved_bytes() to readers of the header.
  void PublishReserved();

  InstancePaths paths_;
  Logger* log_ = nullptr;
  uint32_t cache_id_ = 0;
  uint32_t session_id_ = 0;
  std::string name_;
  std::string fingerprint_;
  uint64_t file_bytes_ = 0;  // the header and the tables, counted against the cap
  int num_nodes_ = 1;
  bool destroyed_ = false;
  int growing_ = 0;  // growths between BeginGrowth and EndGrowth
  ShmFile header_file_;
  layout::CacheHeader* header_ = nullptr;
  std::vector<ShmFile> tables_;
  std::vector<IndexTable> index_;  // over tables_
  uint64_t spill_reads_ = 0;       // since this daemon started
  bool spill_stopped_ = false;     // StopSpilling ran
  SegmentAllocator alloc_;         // lent header_ (Attach) while it is mapped
};

}  // namespace shmcache
