// Store: every session and cache of this daemon, and the server-wide memory
// account. The control plane's single source of truth.
//
// Thread safety: every public method locks the store's mutex (mu_; the
// annotations say which state it guards); the data path never comes here,
// so the mutex sees only control requests. The CacheStates in caches_ are
// used only with mu_ held.
//
// It holds the daemon's concepts as classes of their own: each cache's
// CacheState (with its SegmentAllocator), the CacheSpiller (the spill
// store), and at start an Adoption of what an earlier server left.
// Its own work is split by concept: store.cc (start, server info,
// shutdown), store_sessions.cc (the registry of sessions and caches, held
// memory), store_preparer.cc (the segment preparers' threads),
// store_leases.cc (chunk leases, index growth, spilled rows) and
// store_releases.cc (chunks of ended connections).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/memory_bounds.h"
#include "common/process_state.h"
#include "daemon/cache_spiller.h"
#include "daemon/cache_state.h"
#include "daemon/daemon_options.h"
#include "daemon/held_memory.h"
#include "daemon/memory_account.h"
#include "daemon/shm_pages.h"
#include "daemon/spill_stages.h"
#include "format/instance.h"
#include "format/shm_file.h"
#include "port/mutex.h"
#include "shmcache/stats.h"
#include "shmcache/status.h"

namespace shmcache {

class Logger;

class Store {
 public:
  // The largest cache size (MB) OpenCache accepts: INT64_MAX bytes.
  static constexpr uint64_t kMaxCacheSizeMb = uint64_t{INT64_MAX} >> 20;

  Store(const DaemonOptions& options, const InstancePaths& paths, int num_nodes,
        int workers, Logger* log);
  ~Store();

  // Opens the spill store and adopts what a previous daemon of this
  // instance left in shared memory and on disk; what cannot be trusted
  // (including files that are not ours: see ShmFile) is discarded with a
  // log line and a startup note. Spilled rows whose spill database this
  // server does not use (another -s, or none) are dropped from the index,
  // and that database is removed. When *stop_requested turns true meanwhile
  // (a signal), stops adopting and returns Unavailable, leaving the files
  // that are not adopted yet as they are, for the next start. Then it
  // writes the sessions list and the spill record; whatever holds their
  // names that is not theirs (a directory, a link, another user's file:
  // what a restart would otherwise lose sessions to) is removed with a log
  // line, or, when this user may not remove it, Init fails naming it and
  // the fix.
  Status Init(const std::atomic<bool>* stop_requested = nullptr) EXCLUDES(mu_);
  // What a person starting the server should know about Init: caches and
  // rows that were discarded, and why. One line each.
  // REQUIRES: Init returned; not called concurrently with Init.
  const std::vector<std::string>& startup_notes() const { return notes_; }

  uint32_t NewClientId() EXCLUDES(mu_);
  // A session exists once the sessions list names it (what a restarted
  // server adopts): when the list cannot be written, no session is created
  // and the IOError says why.
  Status CreateSession(uint32_t* id) EXCLUDES(mu_);
  // Destroys the session's caches. Memory that processes still map stays
  // counted against the cap (held) until they unmap it; what nobody maps
  // is released before this returns. When the sessions list cannot be
  // rewritten, the session is destroyed all the same and the IOError says
  // that a restart would list it again, empty.
  Status DestroySession(uint32_t id) EXCLUDES(mu_);
  Status CheckSession(uint32_t id) EXCLUDES(mu_);
  // size_mb above kMaxCacheSizeMb is InvalidArgument: its bytes would not
  // fit an off_t (and wrap as 64-bit bytes from 2^44 MB on).
  Status OpenCache(uint32_t session_id, const std::string& name,
                   const std::string& fingerprint, uint64_t size_mb, bool spill_requested,
                   uint32_t* cache_id) EXCLUDES(mu_);
  Status LeaseChunk(uint64_t conn, uint32_t cache_id, int node, uint64_t need,
                    ChunkLease* out) EXCLUDES(mu_);
  Status ReturnChunk(uint64_t conn, uint32_t cache_id, uint32_t seg_no, uint64_t offset)
      EXCLUDES(mu_);
  // Adds an index table to the cache unless one was added since the client
  // saw `seen` tables (CacheState's growth steps). The lock is let go while
  // the table is made and while the older tables' slots are freed: other
  // requests wait only for the publish and the copy. A growth of the same
  // cache under way is waited for (its table then answers this one). At
  // its end, the older tables' bytes released, caches that the cap made
  // full meanwhile take rows again (ResumeCachesLocked). A step that throws
  // (an allocation, std::random_device), with the lock or without, ends the
  // growth as a failed one: IOError naming what was thrown, no new table
  // left behind, the lock let go and the waiters woken; thrown once its
  // table was added, the growth is done and says what FinishGrowth said.
  Status GrowIndex(uint32_t cache_id, uint32_t seen) EXCLUDES(mu_);
  // The connection of `process` ended. Its chunks' unused tails are
  // recycled once the process is gone (checked now, then by
  // RetryReleases); a process still alive after kReleaseGrace keeps them.
  // Held by a pidfd where the kernel has them, so that a pid reused after
  // the process died does not keep its chunks locked. A null `process`
  // counts as gone.
  void ReleaseConnection(uint64_t conn, std::shared_ptr<const ProcessHandle> process)
      EXCLUDES(mu_);
  static constexpr std::chrono::seconds kReleaseGrace{10};
  // Writes a row that did not fit in memory to the spill store and
  // publishes it. Full when the cache does not spill (or stopped).
  Status SpillPut(uint32_t cache_id, uint64_t row_id, std::span<const std::byte> row,
                  bool* inserted) EXCLUDES(mu_);
  // (*statuses)[i] as CacheSpiller::Get says, but for a row that failed
  // its check (a table block failing its checksum, bytes that are not the
  // row): the row is dropped from the cache's index (DropCorruptRow) and
  // its Corruption says so. Only the daemon writes the spill database and
  // the trainer that reads the row as a miss puts it again, so it is
  // replaced by a healthy copy, or stays absent.
  Status SpillGet(uint32_t cache_id, std::span<const uint64_t> ids,
                  std::vector<std::string>* rows, std::vector<Status>* statuses)
      EXCLUDES(mu_);
  // The staging file of connection `conn` for spilled rows of the cache
  // (SpillStages::Get). Full when the cache does not spill.
  Status SpillStage(uint64_t conn, uint32_t cache_id, uint64_t min_bytes, uint32_t* tag,
                    uint64_t* size) EXCLUDES(mu_);
  // Writes the rows `conn` staged in its stage `tag` (CacheSpiller::
  // WriteStaged) without the store's lock, then publishes each;
  // (*inserted)[i] is 1 for a row added, 0 for an id already cached. Full
  // when the cache does not spill or stopped (a failed write stops it);
  // NotFound when the stage is not this connection's current one.
  Status SpillPutStaged(uint64_t conn, uint32_t cache_id, uint32_t tag,
                        std::span<const uint64_t> ids, std::span<const uint32_t> sizes,
                        std::vector<uint8_t>* inserted) EXCLUDES(mu_);
  void ListSessions(std::vector<SessionInfo>* out) EXCLUDES(mu_);
  void FillServerInfo(ServerInfo* out) EXCLUDES(mu_);
  // A client connection opened (+1) or ended (-1); for the statistics.
  void CountConnection(int delta) { connections_.fetch_add(delta); }
  // Destroys everything and removes every shared-memory file.
  void Shutdown() EXCLUDES(mu_);

  // The steps under the lock of a growth (GrowIndex) and of a segment job
  // (PrepareSegments) where TestHooks::locked_step runs.
  enum class LockedStep {
    kGrowthBegun,      // BeginGrowth reserved the table, before running_jobs_
    kGrowthFinishing,  // the table made, the lock taken again: before FinishGrowth
    kGrowthFinished,   // FinishGrowth added it, before the slots are freed
    kGrowthEnding,     // the slots freed, the lock taken again: before EndGrowth
    kJobTaken,         // a segment job taken from jobs_, before running_jobs_
    kJobFinishing,     // the job ran, the lock taken again: before FinishSegmentJob
  };
  // For tests only, set before any request: table_made runs in a growth
  // (GrowIndex) once its table is made, the lock let go, before it is
  // published (a test holds the growth there, or ends the process there);
  // locked_step at each LockedStep, with the lock held (a test throws
  // there, as an allocation would).
  struct TestHooks {
    std::function<void()> table_made;
    std::function<void(LockedStep)> locked_step;
  };
  void SetTestHooks(TestHooks hooks) { test_hooks_ = std::move(hooks); }

  // Fixed at construction: account_.cap never changes.
  uint64_t memory_cap() const { return bounds_.cap_bytes; }
  // What the cap was chosen from, at start.
  const MemoryBounds& memory_bounds() const { return bounds_; }
  const InstancePaths& paths() const { return paths_; }

 private:
  Status CacheFor(uint32_t cache_id, CacheState** out) REQUIRES(mu_);
  // A growth in steps (GrowIndex) from BeginGrowth on: what it holds, for
  // its end on every path.
  struct GrowthRun {
    uint32_t cache_id = 0;
    CacheState* cache = nullptr;  // stays: its destroy waits (running_jobs_)
    CacheState::Growth g;
    ShmFile file;             // the table made, until FinishGrowth takes it
    uint32_t tag = 0;         // of the table's file name
    bool made = false;        // that file was created
    bool registered = false;  // in running_jobs_
    Status finished;          // FinishGrowth's answer
  };
  // GrowIndex's steps after BeginGrowth, the lock let go while the table is
  // made and while the older tables' slots are freed; returns holding it.
  Status GrowInSteps(GrowthRun* run) REQUIRES(mu_);
  // Ends the growth on either path: what a step that threw left is done
  // as a failed growth's steps do it (its table file removed, the reserved
  // bytes released, the slots freed), then EndGrowth, running_jobs_, the
  // waiters. Each part once: it reads the steps' flags.
  void EndGrowthLocked(GrowthRun* run) REQUIRES(mu_);
  // Runs a segment job taken from jobs_, the lock let go while it runs,
  // and hands it back to its cache (FinishSegmentJob); a step that throws
  // ends it as a failed job (a created file removed).
  void RunSegmentJobLocked(const SegmentJob& job) REQUIRES(mu_);
  // What `e` says (std::exception::what), for a log line and a Status.
  static std::string WhatThrew(const std::exception_ptr& e);
  // TestHooks::locked_step, when set.
  void AtLockedStep(LockedStep step) REQUIRES(mu_) {
    if (test_hooks_.locked_step) test_hooks_.locked_step(step);
  }
  // CacheFor, once no growth in steps of the cache (Store::GrowIndex) is
  // under way; waits for it (job_done_cv_). What may grow the index of the
  // cache under the lock asks this first: inside such a growth it would
  // reserve a second table of the same generation, and where the cap has
  // room for one only, fail and mark the cache full though that growth's
  // table comes a moment later.
  Status CacheNotGrowing(uint32_t cache_id, CacheState** out) REQUIRES(mu_);
  // CacheFor's cache when it may spill now; Full when it does not (or this
  // server does not spill): what a staged spill asks first.
  Status SpillingCacheFor(uint32_t cache_id, CacheState** out) REQUIRES(mu_);
  void CountSpillReads(uint32_t cache_id, uint64_t n) EXCLUDES(mu_);
  // Drops spilled row `row_id` (`bytes` as read, 0 when unreadable), which
  // failed its check for `why`, logging it once; the row's Corruption for
  // the reader.
  Status DropCorruptRow(uint32_t cache_id, uint64_t row_id, uint64_t bytes,
                        const Status& why) EXCLUDES(mu_);
  // Background threads making caches' next segments and supplying their
  // pages ahead of need (see SegmentJob), one job each at a time; the first
  // (`polls`) also re-checks ended connections whose process was still
  // running, and held memory.
  void PrepareSegments(bool polls) EXCLUDES(mu_);
  // Settles pending releases whose process is gone or whose grace ran out.
  void RetryReleasesLocked() REQUIRES(mu_);
  // Logs, once per process, that the chunks of a live process's ended
  // connections stay with it.
  void WarnChunksStayLocked(int pid) REQUIRES(mu_);
  // Looks for processes that map held memory (without mu_: it reads
  // /proc) and releases what none maps any more.
  void SettleHeldMemory() EXCLUDES(mu_);
  // Caches the cap made full take rows again when memory was freed.
  void ResumeCachesLocked() REQUIRES(mu_);
  // The budget of a cache opened with `size_mb` (0: the cap).
  uint64_t BudgetFor(uint64_t size_mb) const REQUIRES(mu_);
  void StopPreparer() EXCLUDES(mu_);
  // Logs `text` as a warning and keeps it for startup_notes().
  void Note(const std::string& text);
  // Rewrites the sessions list; an error is logged and returned.
  Status WriteSessionsFile() REQUIRES(mu_);
  // Frees the names of the sessions list and the spill record of what is
  // not this server's (ClaimFileName, replace_file.h), with a log line.
  Status ClaimFileNames() REQUIRES(mu_);
  void CheckHighWater() REQUIRES(mu_);

  Mutex mu_;
  DaemonOptions options_;
  InstancePaths paths_;
  ShmPages shm_pages_;   // of paths_.shm_dir, at start
  MemoryBounds bounds_;  // of account_.cap, at start
  int num_nodes_;
  int workers_;
  Logger* log_;
  MemoryAccount account_ GUARDED_BY(mu_);
  bool warned_high_water_ GUARDED_BY(mu_) = false;
  std::mt19937 rng_ GUARDED_BY(mu_);
  uint32_t next_client_id_ GUARDED_BY(mu_) = 1;
  static constexpr int kCacheIdTries = 8;
  // id -> cache ids
  std::map<uint32_t, std::vector<uint32_t>> sessions_ GUARDED_BY(mu_);
  std::map<uint32_t, std::unique_ptr<CacheState>> caches_ GUARDED_BY(mu_);
  // Its store is opened by Init and closed by Shutdown, when no request
  // runs; SpillGet reads through it without mu_ (see CacheSpiller).
  CacheSpiller spiller_;
  std::vector<std::string> notes_;  // written by Init only
  std::deque<SegmentJob> jobs_ GUARDED_BY(mu_);
  CondVar jobs_cv_;
  CondVar job_done_cv_;  // a segment job finished
  // The caches of the jobs running now without mu_ (segment jobs, index
  // growths), one entry per job.
  std::multiset<uint32_t> running_jobs_ GUARDED_BY(mu_);
  // The caches of the staged spill writes running now (without mu_), one
  // entry each: a cache is destroyed only once none runs (job_done_cv_).
  std::multiset<uint32_t> spill_writes_ GUARDED_BY(mu_);
  SpillStages stages_;
  struct PendingRelease {
    uint64_t conn;
    std::shared_ptr<const ProcessHandle> process;
    std::chrono::steady_clock::time_point deadline;
  };
  std::vector<PendingRelease> pending_releases_ GUARDED_BY(mu_);
  // Processes told about by WarnChunksStayLocked; bounded.
  std::set<int> warned_pids_ GUARDED_BY(mu_);
  static constexpr size_t kMaxWarnedPids = 1024;
  HeldMemory held_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  // As many as the CPUs this daemon may run on: one segment file's pages
  // are made by one thread at a time (the kernel makes a file's pages under
  // its lock), so the page supply of many writers needs as many segments
  // open and supplied at once (SegmentAllocator::Lease).
  std::vector<std::thread> preparers_;
  int preparer_threads_ = 1;  // preparers_.size(), set by Init before requests
  std::atomic<int64_t> connections_{0};
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  const uint64_t started_unix_ = static_cast<uint64_t>(std::time(nullptr));
  TestHooks test_hooks_;
};

}  // namespace shmcache
