// SegmentAllocator: one cache's row memory. It owns the cache's data
// segments per NUMA node (their files: named, created, formatted, adopted
// from an earlier server, made ahead of need by segment jobs), the chunks
// leased from them to each connection, the free tails of chunks given
// back, and the accounting of the cache's budget: what is left of it and
// of the server's cap, and the cache's full state when one runs out.
//
// Chunk leasing is the only allocation: a client bump-allocates rows inside
// its chunk without talking to anyone. When it closes or dies (its
// connection ends), the part of each chunk past the chunk's `used` mark is
// recycled into a new chunk; a row killed mid-write is inside `used` and is
// the only space lost.
//
// The cache's header (its state word, read by every client) is the
// CacheState's mapping; Attach lends it here, and Release takes it back.
// Errors are Statuses: Full or FullServerCap when memory is used up,
// TooLarge for one row that does not fit, NotFound once released.
//
// Thread safety: none; the Store's mutex guards every call (CacheState
// calls it under that lock). CreateSegmentFile alone touches no state.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/option_checks.h"
#include "daemon/held_memory.h"
#include "daemon/memory_account.h"
#include "format/instance.h"
#include "format/layout.h"
#include "format/shm_file.h"
#include "shmcache/status.h"

namespace shmcache {

class Logger;

// Making the next segments of a cache ahead of need, and their pages, off
// the store's lock (posix_fallocate, and clearing on huge pages, take a
// while):
// TakeSegmentJobs reserves the memory and names the files, TakeSupplyJobs
// names the next pages of the segments being carved; the caller runs each
// job with RunSegmentJob (several at once on as many threads: the kernel
// makes one file's pages under that file's lock, so one file is one
// thread's page supply) and hands it back with FinishSegmentJob.
//
// A segment file is created at its full size but sparse: only the pages a
// writer may be handed next are supplied (allocated; cleared only on huge
// pages: kSegmentClearing), in steps
// of kSupplyStep ahead of the segment's carve mark, so that pages made
// ahead of need are bounded (about 26 MB for the segment being carved, and
// the first 18 MB of each segment made ahead) whatever the cache's size, while the
// segments keep their sizes (a quarter of the cache each: few segments for readers to
// map). A chunk is leased only from supplied pages: a writer never touches a hole, so a
// full /dev/shm is a Full status from the supply, never a SIGBUS.
// Segment pages of 4 KB are not cleared when supplied: writers write a
// batch's rows into them through the file's descriptor, whole pages that
// need no clearing (ChunkWriter), where clearing them first cost two thirds
// of a put's CPU (docs/performance.md). A page no writer wrote reads as
// zero all the same: the kernel clears it at its first fault.
inline constexpr Clearing kSegmentClearing = Clearing::kHugeOnly;

struct SegmentJob {
  uint32_t cache_id;
  uint32_t seg_no;
  int node;
  uint64_t size;  // the segment's
  // A new segment's file (create) with its first supply_to bytes supplied,
  // or the pages of [supply_from, supply_to) of an existing one.
  bool create = true;
  uint64_t supply_from = 0;
  uint64_t supply_to = 0;
};

struct ChunkLease {
  uint32_t seg_no = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  // (the allocator's) The writer's `used` mark when the chunk's end was
  // last taken back from it (layout::kRoomTaken), for a return it has not
  // seen.
  uint64_t taken_at = 0;
};

class SegmentAllocator {
 public:
  static constexpr uint64_t kChunkBytes = 4u << 20;
  // A chunk takes at most this share of its cache's budget, and at most
  // half of a writer's share of it once more than two connections hold
  // chunks (ChunkShare): a writer's chunk must leave the others theirs
  // (each DataLoader worker is a writer; 4 MB took the whole of a 1 MB
  // cache). Budgets of 16 MB and more keep kChunkBytes for up to two
  // writers, of 8 MB times the writers for any number.
  static constexpr uint64_t kChunksPerBudget = 4;
  static constexpr uint64_t kMinRecycleBytes = 16u << 10;
  // At most this many segments are made at once for one node of a cache.
  static constexpr int kMaxParallel = 64;
  // The pages of a segment are supplied kSupplyStep bytes at a time, when
  // fewer than kSupplyAhead are left supplied past its carve mark (2 MB
  // aligned, for huge pages): at most kSupplyAhead + kSupplyStep (+ 2 MB)
  // ahead. A segment made ahead of need comes with kSupplyAhead supplied,
  // so that a writer moving into it goes on without waiting for a step.
  static constexpr uint64_t kSupplyStep = 8u << 20;
  static constexpr uint64_t kSupplyAhead = 16u << 20;

  SegmentAllocator(const InstancePaths& paths, uint32_t cache_id, int num_nodes,
                   Logger* log);
  SegmentAllocator(const SegmentAllocator&) = delete;
  SegmentAllocator& operator=(const SegmentAllocator&) = delete;

  // Lends the cache's mapped header, the label its log lines name the cache
  // by, and its budget; before any other call. The header stays the
  // caller's and must stay mapped until Release.
  void Attach(layout::CacheHeader* header, const std::string& label,
              uint64_t budget_bytes);

  // A chunk of at least `need` bytes of row space for connection `conn`:
  // a recycled tail, or carved from the node's open segments, the oldest
  // whose supplied pages hold it. With `wait`, when none does but a segment
  // made ahead of need fits, that one is opened beside them (the writers
  // outran their page supply: each open segment is supplied by its own
  // thread); the rest of an open segment that no longer holds the row is
  // left when the next one is opened, as it always was. Each writer has
  // segments of its own where it can: an open segment another connection
  // holds a chunk in is passed over (WritingElsewhere) for the others, then
  // for a segment made ahead, opened for this writer; only when neither is
  // there do writers share one, and the next batch made ahead then has a
  // segment for each writer (TakeSegmentJobs).
  // Once the budget or the server cap is used up, the end of the room
  // another connection's chunk holds past its `used` mark is taken back
  // (half of the most any chunk holds, or what the row needs:
  // layout::kRoomTaken) and leased; then room on the other nodes (the
  // budget is the whole cache's): free tails, the rest of open segments and
  // segments made ahead, then room taken back there. Full when none holds the row
  // (the cache is then marked full for every client). TooLarge when only
  // this row does not fit: what is left still holds a segment of
  // layout::kMinSegmentBytes, so the cache is not marked and smaller rows
  // go on being cached.
  // When the node's next segment, or the pages of the chunk, are being
  // prepared in the background (or are to be: TakeSupplyJobs names them,
  // for another node's segment too) and `wait` is given, sets *wait
  // instead of leasing: the caller takes the jobs, of every node, waits
  // for them to finish (FinishSegmentJob) and asks again.
  // Without `wait` a segment and its pages are made on the spot
  // (Unavailable when a job supplying them is still out). A shm filesystem
  // without room for the pages is Full (FullNoShmRoom), the cache marked
  // full with one warning, as for a segment that could not be made.
  Status Lease(uint64_t conn, int node, uint64_t need, MemoryAccount* account,
               ChunkLease* out, bool* wait = nullptr);
  // The size of a new chunk carved for a row of `need` bytes: the row
  // alone when it is max_bytes or more, else as many rows of that size as
  // max_bytes holds (a chunk of whole rows: no tail when rows are alike).
  static uint64_t ChunkSizeFor(uint64_t need, uint64_t max_bytes = kChunkBytes);
  // Takes back the unused tail of a chunk leased to `conn` (less what was
  // taken from it for another writer). A cache marked full takes rows
  // again when that frees kMinRecycleBytes or more (with the free room it
  // touches), until a lease finds no room for its row.
  void Return(uint64_t conn, uint32_t seg_no, uint64_t offset);
  // The connection ended. recycle: its process is gone, so the unused
  // tails of its chunks are free again; otherwise (a live process whose
  // connection broke may still write into them) they are only forgotten.
  void ReleaseConnection(uint64_t conn, bool recycle = true);

  // The next segments of `node`, to be made ahead of need, when nothing is
  // being made for it and what is left uncarved (of the current segment and
  // the prepared ones) is at most half of the last batch. One batch holds
  // the bytes one segment would (a quarter of what the cache holds; see
  // NextSegmentSize), split into as many segments of kMinSegmentBytes or
  // more as writers showed they need, up to `max_jobs`: each lease that
  // had to wait for a prepared segment doubles that count (from 1), so a
  // cache filled by one writer that the supply keeps up with has one
  // segment per batch, as before, and a cache filled by many is supplied by
  // many threads. For a cache past kMaxSegmentBytes per segment, the batch
  // grows instead (up to max_jobs segments of kMaxSegmentBytes), so that
  // the number of segments stays what it was.
  std::vector<SegmentJob> TakeSegmentJobs(int node, MemoryAccount* account, int max_jobs);
  // The next pages of the node's open segments: for each, one job when
  // fewer than kSupplyAhead are supplied past its carve mark (or a waiting
  // lease needs more) and none is out for it; kSupplyStep more, or what the
  // lease needs. None for a full cache.
  std::vector<SegmentJob> TakeSupplyJobs(int node);
  // Runs a job (either kind): *file is the new segment's mapping for a
  // create job. Thread-safe (touches no state).
  static Status RunSegmentJob(const InstancePaths& paths, const SegmentJob& job,
                              ShmFile* file);
  // Hands a job back: a made segment is kept among the prepared ones (in
  // the order they were named), a failed one's reservation released. An
  // allocation may throw only while a made segment is kept, and `keeping`
  // (the tests' hook; may be empty) runs just before: a throw from either
  // changes nothing (the job still counts as running, its memory reserved,
  // its file in place), and the caller ends the job as a failed one
  // (Store::RunSegmentJobLocked: the file removed, FinishSegmentJob again
  // with the error, which allocates nothing).
  void FinishSegmentJob(const SegmentJob& job, const Status& made, ShmFile file,
                        MemoryAccount* account,
                        const std::function<void()>& keeping = nullptr);
  // Creates and formats a segment file of `size` bytes, the first `supply`
  // of them supplied (all by default). Thread-safe (touches no state).
  static Status CreateSegmentFile(const InstancePaths& paths, uint32_t cache_id,
                                  uint32_t seg_no, int node, uint64_t size, ShmFile* out,
                                  uint64_t supply = UINT64_MAX);
  // Bytes of a new segment of `size` supplied with it: its header and
  // kSupplyAhead, in whole 2 MB pages.
  static uint64_t FirstSupply(uint64_t size);

  // Takes over segment `seg_no` an earlier server left, once it is checked
  // (ShmFile::Open, CheckSegmentFile, a carved mark on a cache line, a node
  // this server has). Chunks it leased stay with whoever holds them; only
  // the space never carved is handed out again: a segment never carved (one
  // made ahead of need) is handed out after the node's current one (the
  // last carved, adopted in order), and one carved before that whose rest
  // holds a chunk (kChunkBytes) stays open beside it. What
  // lies past the carve mark counts as not supplied (the earlier server may
  // have left a hole there): it is supplied again before it is leased. A
  // segment never finished (no magic) is removed. Corruption names the file
  // otherwise refused.
  Status AdoptSegment(uint32_t seg_no);

  // Marks the cache full for every client; warns once (later times are
  // logged as information).
  void MarkFull(const std::string& why);
  // Records that the cap set `bits`: ResumeIfCapAllows clears them, and
  // readers see kStateByCap (a refused put names the cap, not the budget).
  void MarkByCap(uint32_t bits);
  // A cache that the server's cap (not its budget) made full takes rows
  // again once the cap has room for a segment. True when it resumed.
  bool ResumeIfCapAllows(const MemoryAccount& account);
  // The cache's budget becomes `bytes` when that is more (a budget is never
  // lowered: nothing is evicted), in the header too, where writers check a
  // row against it. A cache its budget made full takes rows again; one the
  // server's cap made full stays so until the cap has room
  // (ResumeIfCapAllows), and a spilling cache whose memory was used up
  // goes on spilling. True when the budget was raised.
  bool RaiseBudget(uint64_t bytes);
  // A cache marked full (not one whose memory is used up while it spills;
  // one whose spilling stopped, yes) takes rows again, `why` logged: room
  // was given back, or spilling was asked for (its next row past memory
  // goes to disk). True when it was full.
  bool TakeRowsAgain(const std::string& why);

  // Unlinks every segment (prepared ones too) and forgets every lease and
  // the header. With `held`, the files' identities and sizes are appended
  // there (see CacheState::Destroy). Returns the bytes recorded in `held`.
  uint64_t Release(std::vector<HeldFile>* held);

  // Segments made, being made or adopted: counted against the budget (at
  // their full sizes, supplied or not).
  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t budget_bytes() const { return budget_bytes_; }

 private:
  struct Segment {
    uint32_t seg_no;
    int node;
    uint64_t size;
    uint64_t carved;
    ShmFile file;
    uint64_t supplied = 0;     // pages below this are allocated and cleared
    bool supplying = false;    // a supply job is out for it
    uint64_t supply_need = 0;  // what a waiting lease needs supplied
    Status supply_error;       // of the last job, told to the next lease
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
    uint64_t supplied;
  };
  // The chunk that holds the most room past its writer's `used` mark (the
  // word as read), and that room.
  struct HeldRoom {
    ChunkLease* lease = nullptr;
    uint64_t mark = 0;
    uint64_t bytes = 0;
  };
  // Tries at taking a chunk's end while its writer moves the mark.
  static constexpr int kTakeTries = 64;

  // Size of the next segment, at least min_bytes and at most max_bytes
  // unless min_bytes asks for more; 0 when the budget or the cap leaves
  // less.
  uint64_t NextSegmentSize(uint64_t min_bytes, const MemoryAccount& account,
                           uint64_t max_bytes = layout::kMaxSegmentBytes) const;
  uint64_t BudgetLeft() const;
  // No segment of min_bytes fits a chunk of chunk_bytes, nor other room:
  // TooLarge when an ordinary segment still would, or a row of the
  // cache's average size so far still fits (LargestRowNow), naming the
  // most one row can take now and the fix; else the cache's memory is
  // used up (see MemoryUsedUp).
  Status NoRoomFor(uint64_t conn, uint64_t chunk_bytes, uint64_t min_bytes,
                   const MemoryAccount& account);
  // The largest row a lease could hold now, on any node: in a free tail,
  // the rest of an open segment, a segment made ahead, a new segment of
  // `room` bytes, or the `held` room another writer's chunk could give.
  uint64_t LargestRowNow(uint64_t room, uint64_t held) const;
  // Spilling caches send further rows to disk, others stop taking rows.
  // by_cap: the server's cap ran out, not the budget (ResumeIfCapAllows).
  Status MemoryUsedUp(const std::string& why, bool by_cap);
  void AddSegment(uint32_t seg_no, int node, uint64_t size, ShmFile file,
                  uint64_t supplied);
  // Frees `tail` for leases on its segment's node, joined with the free
  // tails it touches. Returns the size of the free tail it is now part of,
  // or 0 when that is under min_bytes (then it is not kept).
  uint64_t AddTail(Tail tail, uint64_t min_bytes);
  // Whether a connection other than `conn` holds a chunk of segment
  // `seg_no`. A lease carves from such a segment only when no other open
  // segment holds its chunk and none was made ahead: writers of a tmpfs
  // file (pwritev, and the supply's fallocate) take that file's lock for
  // each call, so writers that share one file write one at a time and are
  // supplied by one thread, however many they are (issue 36: 2 writer
  // processes filled no faster than one).
  bool WritingElsewhere(uint64_t conn, uint32_t seg_no) const;
  // Writers of the cache: `conn` and the other connections that hold
  // chunks.
  int Writers(uint64_t conn) const;
  // The most a chunk of rows leased to `conn` takes: the budget's
  // kChunksPerBudget-th part, or its (2 x lessees)-th where more
  // connections hold chunks (`conn` among them), within
  // [kMinRecycleBytes, kChunkBytes].
  uint64_t ChunkShare(uint64_t conn) const;
  // The chunk Lease carves from `seg` for a row of `need` bytes: of
  // ChunkSizeFor (up to `share`), up to the next 4 KB page boundary (so
  // that carve marks lie on pages), or the segment's rest.
  uint64_t ChunkSize(const Segment& seg, uint64_t need, uint64_t share) const;
  // Leases `conn` the first free tail on `node` that holds a row of
  // `need`: a chunk of ChunkSizeFor (up to `share`) from its start, or the
  // whole tail where less than kMinRecycleBytes would be left. False when
  // none holds it.
  bool LeaseTail(uint64_t conn, int node, uint64_t need, uint64_t share, ChunkLease* out);
  // Where the writer of chunk `l` has written up to, its chunk header's
  // `used` word being `mark`: the mark, or where it was when the chunk's end
  // was taken and not seen since; the chunk's end for a mark out of it.
  static uint64_t UsedMark(const ChunkLease& l, uint64_t mark);
  // The chunk on `node` (on any with kAnyNode) leased to another
  // connection than `conn` with the most room past its `used` mark.
  static constexpr int kAnyNode = -1;
  HeldRoom MostRoomHeld(uint64_t conn, int node);
  // Takes back the end of that chunk's room, half of it or `want` bytes
  // when more, into a free tail on the chunk's node (see
  // layout::kRoomTaken). False when it does not hold `want`.
  bool TakeRoom(uint64_t conn, int node, uint64_t want);
  // The first segment made ahead of need for `node` that holds a chunk of
  // `want` (the order they were named in), or prepared_[node].end().
  std::deque<Prepared>::iterator FirstPreparedFor(int node, uint64_t want);
  // Makes sure the pages of `seg` below `end` are supplied before a chunk
  // is carved there: at once without `wait`, else by a job (*wait set).
  Status SupplyFor(Segment* seg, uint64_t end, bool* wait);
  // A segment for a chunk for a row of `row_bytes` (of `share` at most:
  // ChunkSize), or, when the budget or the cap leaves none, room elsewhere:
  // taken back from another writer on `node` (TakeRoom), free on another
  // node (a tail: *out is then null; or a segment: OtherNodesRoom; or,
  // with `wait`, one being made there: *wait), or taken back from a writer
  // on another node.
  Status NewSegment(uint64_t conn, int node, uint64_t row_bytes, uint64_t share,
                    MemoryAccount* account, Segment** out, bool* wait);
  // Where on `node` (another than the lease's) the chunk Lease carves for
  // a row of `need` bytes (of `share` at most) fits: the first open
  // segment whose supplied pages hold it, else a segment made ahead for
  // `node` (opened there), else the first open segment whose rest holds
  // it once its pages are supplied (SupplyFor: the lease may wait for a
  // job on `node`); null when none.
  Segment* OtherNodesRoom(int node, uint64_t need, uint64_t share);
  // Creates and formats a segment under the first free number from
  // next_seg_no_ on, and moves next_seg_no_ past it.
  Status CreateNextSegment(int node, uint64_t size, uint32_t* seg_no, ShmFile* out);
  static void FormatSegment(ShmFile* f, uint32_t cache_id, uint32_t seg_no, int node,
                            uint64_t size);
  // The header of the chunk at `offset` of segment `seg_no`.
  layout::ChunkHeader* HeaderAt(uint32_t seg_no, uint64_t offset) const;
  layout::ChunkHeader* ChunkAt(uint32_t seg_no, uint64_t offset, uint64_t size);

  // label_, or "cache <id>" before Attach gave one: how messages name it.
  std::string Label() const;

  InstancePaths paths_;
  Logger* log_ = nullptr;
  uint32_t cache_id_ = 0;
  int num_nodes_ = 1;
  layout::CacheHeader* header_ = nullptr;  // the CacheState's; see Attach
  std::string label_;
  bool released_ = false;
  uint64_t budget_bytes_ = 0;
  uint64_t data_bytes_ = 0;               // segments, counted against the budget
  uint32_t cap_full_bits_ = 0;            // state bits set because the cap ran out
  bool full_said_ = false;                // MarkFull warned
  std::map<uint32_t, Segment> segments_;  // by seg_no
  uint32_t next_seg_no_ = 0;
  std::vector<std::deque<Prepared>> prepared_;  // per node: made ahead
  std::vector<int> preparing_;                  // per node: jobs running
  std::vector<int> parallel_;                   // per node: segments a batch
  std::vector<uint64_t> batch_bytes_;           // per node: the last batch
  std::vector<int> current_;                    // per node: seg_no or -1
  // Per node: the segments chunks are carved from, oldest first (see
  // Lease); the newest is current_.
  std::vector<std::vector<uint32_t>> open_;
  std::vector<std::vector<Tail>> tails_;                // per node
  std::map<uint64_t, std::vector<ChunkLease>> leases_;  // by connection
};

}  // namespace shmcache
