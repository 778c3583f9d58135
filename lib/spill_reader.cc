#include "lib/spill_reader.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/iterator.h>

#include "format/spill_format.h"
#include "lib/fork_safety.h"

namespace shmcache {

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A secondary instance logs nothing anywhere: with no log of its own it
// needs no directory to keep one in.
class NullLogger : public rocksdb::Logger {
 public:
  using rocksdb::Logger::Logv;
  void Logv(const char*, va_list) override {}
};

}  // namespace

namespace spill_reader_internal {

struct Entry {
  std::shared_ptr<SpillReader> reader;
  int64_t retry_at_ms = 0;  // when reader is null: when to try again
  int64_t uses = 0;         // SpillReader::Use claims on it; the entry goes at 0
};

// Readers by spill record path. After fork() the parent's readers are left
// alone (never closed: RocksDB's state in the child is the parent's) and
// the child opens its own.
struct Readers {
  ForkSafeMutex mu{LockRank::kSpillReaders};
  // Held while a reader is opened or closed (after mu, if with it; nothing is
  // taken while it is held): RocksDB builds
  // process-wide state then (function-local statics, its thread-local
  // registry), and a child forked in the middle would wait forever for the
  // parent's thread to finish it (seen: a child stuck in
  // DBImpl::GenerateDbSessionId's static). fork() waits for it instead.
  ForkSafeMutex opening{LockRank::kSpillReaderOpen};
  uint64_t fork_gen = ForkGeneration();
  std::map<std::string, Entry> by_record;  // GUARDED_BY(mu)
};

}  // namespace spill_reader_internal

namespace {

using spill_reader_internal::Entry;
using spill_reader_internal::Readers;

Readers& TheReaders() {
  static Readers* readers = new Readers;  // never destroyed (see fork_safety.h)
  return *readers;
}

// Made when the library is loaded, before any thread: a thread making it
// later registers its mutexes, which waits while a fork() takes them all,
// and a child forked meanwhile would wait forever on the half-made static.
const bool g_readers_made = (TheReaders(), true);

void ForgetInheritedLocked(Readers& r) {
  if (r.fork_gen == ForkGeneration()) return;
  (void)new std::map<std::string, Entry>(std::move(r.by_record));
  r.by_record.clear();
  r.fork_gen = ForkGeneration();
}

constexpr int64_t kRetryOpenMs = 1000;

std::atomic<uint64_t> g_rows_read_in_place{0};  // SpillReader::RowsReadInPlace

// Keys are read kReadChunk at a time (a chunk bounds what one call holds).
constexpr size_t kReadChunk = 64;

// What one thread's MultiGet calls read into, kept from call to call.
// With no block cache RocksDB pins no value: it copies each into its
// PinnableSlice's own string. Made per call, those strings were a malloc
// and a free per row, and a batch of 64 x 3 KB rows freed more than glibc
// keeps at the heap's top, so every call gave the pages back to the kernel
// and faulted them in again: a fifth of a 3 KB spilled GetBatch's time
// (docs/performance.md, issue 36). A buffer is kept up to
// SpillReader::kKeptValueBytes (a thread keeps at most kReadChunk of them:
// 1 MB); larger rows, whose copy costs far more than their allocation, are
// freed after each call.
struct ValueBuffers {
  std::vector<SpillKey> keys;
  std::vector<uint32_t> order;  // the chunk's positions, by id
  std::vector<rocksdb::Slice> slices{kReadChunk};
  std::vector<rocksdb::PinnableSlice> values{kReadChunk};
  std::vector<rocksdb::Status> statuses{kReadChunk};

  ValueBuffers() {
    keys.reserve(kReadChunk);
    order.reserve(kReadChunk);
  }
  // Drops every pin (none outlives the call, nor the database it came
  // from) and the buffers over the bound.
  void Release() {
    for (rocksdb::PinnableSlice& v : values) {
      v.Reset();
      if (v.GetSelf()->capacity() > SpillReader::kKeptValueBytes)
        std::string().swap(*v.GetSelf());
    }
  }
};

ValueBuffers& TheValueBuffers() {
  static thread_local ValueBuffers buffers;
  return buffers;
}

}  // namespace

std::shared_ptr<SpillReader> SpillReader::Use::UnclaimLocked(Readers& r) {
  const bool ours = held_ && fork_gen_ == r.fork_gen;
  held_ = false;
  if (!ours) return nullptr;
  auto it = r.by_record.find(key_);
  if (it == r.by_record.end() || --it->second.uses > 0) return nullptr;
  std::shared_ptr<SpillReader> last = std::move(it->second.reader);
  r.by_record.erase(it);
  return last;
}

void SpillReader::Use::Drop() {
  Readers& r = TheReaders();
  std::shared_ptr<SpillReader> closing;  // closes after the lock is released
  std::lock_guard lock(r.mu);
  ForgetInheritedLocked(r);
  dropped_ = true;
  closing = UnclaimLocked(r);
}

std::shared_ptr<SpillReader> SpillReader::ForInstance(const InstancePaths& paths,
                                                      Use* use) {
  Readers& r = TheReaders();
  const std::string key = paths.SpillRecordFile();
  std::shared_ptr<SpillReader> unclaimed;  // closes after the lock is released
  {
    std::lock_guard lock(r.mu);
    ForgetInheritedLocked(r);
    if (use && use->dropped_) {
      // A read that runs on after its cache's Close (on another thread)
      // claims nothing: a reader it opened and kept would have no claim
      // to close it. It reads through the daemon unless a reader is open.
      auto it = r.by_record.find(key);
      return it == r.by_record.end() ? nullptr : it->second.reader;
    }
    if (use && !(use->held_ && use->fork_gen_ == r.fork_gen && use->key_ == key)) {
      unclaimed = use->UnclaimLocked(r);  // another instance's, or the parent's
      ++r.by_record[key].uses;
      use->key_ = key;
      use->fork_gen_ = r.fork_gen;
      use->held_ = true;
    }
    auto it = r.by_record.find(key);
    if (it != r.by_record.end() &&
        (it->second.reader || NowMs() < it->second.retry_at_ms)) {
      return it->second.reader;
    }
    // Nobody else opens it meanwhile: they see a null reader until then.
    Entry& e = r.by_record[key];
    e.reader = nullptr;
    e.retry_at_ms = NowMs() + kRetryOpenMs;
  }
  // Opened outside the lock: it reads the database's manifest (tens of ms).
  std::unique_ptr<SpillReader> opened;
  const std::string db_path = ReadSpillRecord(paths);
  if (!db_path.empty()) Open(db_path, &opened).PermitUncheckedError();
  std::shared_ptr<SpillReader> reader(std::move(opened));
  std::lock_guard lock(r.mu);
  ForgetInheritedLocked(r);
  // Kept for later calls unless its last claim went meanwhile: then it
  // serves this call alone.
  auto it = r.by_record.find(key);
  if (reader && it != r.by_record.end()) {
    it->second.reader = reader;
    it->second.retry_at_ms = 0;
  }
  return reader;
}

void SpillReader::Forget(const InstancePaths& paths, const SpillReader* stale) {
  Readers& r = TheReaders();
  std::lock_guard lock(r.mu);
  ForgetInheritedLocked(r);
  auto it = r.by_record.find(paths.SpillRecordFile());
  if (it != r.by_record.end() && it->second.reader.get() == stale) {
    it->second.reader = nullptr;
    it->second.retry_at_ms = NowMs() + kRetryOpenMs;
  }
}

Status SpillReader::Open(const std::string& db_path, std::unique_ptr<SpillReader>* out) {
  // Options made under it too: their defaults reach RocksDB's statics.
  std::lock_guard opening(TheReaders().opening);  // see Readers
  rocksdb::Options o = SpillReaderOptions();
  o.info_log = std::make_shared<NullLogger>();
  // Every table file stays open: one the daemon compacts away after this
  // reader's last catch-up is still readable through its descriptor.
  o.max_open_files = -1;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s =
      rocksdb::DB::OpenAsSecondary(o, db_path, /*secondary_path=*/"", &db);
  if (!s.ok())
    return Status::IOError("cannot read spill database " + db_path + ": " + s.ToString());
  std::unique_ptr<SpillReader> reader(new SpillReader());
  reader->db_.reset(db);
  reader->path_ = db_path;
  reader->last_catch_up_ms_.store(NowMs());
  *out = std::move(reader);
  return Status::OK();
}

SpillReader::~SpillReader() {
  std::lock_guard closing(TheReaders().opening);  // as an open (Readers)
  db_.reset();
}

void SpillReader::MultiGet(uint32_t cache_id, std::span<const uint64_t> ids,
                           size_t row_bytes, FoundRow found, std::span<bool> got) {
  if (NowMs() - last_catch_up_ms_.load(std::memory_order_relaxed) >= kRefreshIntervalMs) {
    // A failure here is met again, and answered, by the caller's catch-up
    // for a row this view lacks.
    CatchUpUnlessWithin(kRefreshIntervalMs);
  }
  if (row_bytes >= kSeekRowBytes) {
    ReadBySeek(cache_id, ids, found, got);
  } else {
    ReadByMultiGet(cache_id, ids, found, got);
  }
}

void SpillReader::ReadByMultiGet(uint32_t cache_id, std::span<const uint64_t> ids,
                                 FoundRow found, std::span<bool> got) {
  ValueBuffers& buffers = TheValueBuffers();
  // Released however the call ends (`found` may throw): no pin may wait in
  // the thread's buffers for a later call, or outlive the database.
  struct ReleaseAtEnd {
    ValueBuffers& b;
    ~ReleaseAtEnd() { b.Release(); }
  } release_at_end{buffers};
  std::vector<SpillKey>& keys = buffers.keys;
  std::vector<rocksdb::Slice>& slices = buffers.slices;
  std::vector<rocksdb::PinnableSlice>& values = buffers.values;
  std::vector<rocksdb::Status>& statuses = buffers.statuses;
  std::vector<uint32_t>& order = buffers.order;
  for (size_t base = 0; base < ids.size(); base += kReadChunk) {
    const size_t n = std::min(kReadChunk, ids.size() - base);
    // RocksDB sorts a MultiGet's keys unless told they are: through its
    // comparator, a virtual call and a memcmp per comparison, 6.6% of a
    // 3 KB GetBatch's instructions (callgrind, docs/spill-reads.md). A
    // call's keys share the cache id and hold the row id big-endian, so
    // their byte order is the ids' order: sorted here by id.
    order.resize(n);
    for (size_t k = 0; k < n; ++k) order[k] = static_cast<uint32_t>(k);
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return ids[base + a] < ids[base + b]; });
    keys.clear();
    for (size_t k = 0; k < n; ++k) {
      keys.emplace_back(cache_id, ids[base + order[k]]);
      slices[k] = keys[k].slice();
      values[k].Reset();
    }
    db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), n, slices.data(),
                  values.data(), statuses.data(), /*sorted_input=*/true);
    for (size_t k = 0; k < n; ++k) {
      const size_t i = base + order[k];
      got[i] = statuses[k].ok();
      if (statuses[k].ok()) {
        found(i, std::span(reinterpret_cast<const std::byte*>(values[k].data()),
                           values[k].size()));
      }
    }
  }
}

// Large rows. With no block cache, MultiGet copies each value out of the
// mapped table file into its PinnableSlice's string (RocksDB pins a value
// only in a cached block), and the caller copies it again into the row: at
// 1 MB, the two copies were 62% of a GetBatch's samples, the block's
// checksum 8% (perf, docs/spill-reads.md). An iterator's value is a slice
// of the block itself, here the mapped file: the row is copied once. Each
// Seek searches every level where MultiGet stops at the first that has
// the key, a cost that only rows far larger than a key are worth.
void SpillReader::ReadBySeek(uint32_t cache_id, std::span<const uint64_t> ids,
                             FoundRow found, std::span<bool> got) {
  // Level-0 files overlap (each of a shuffled fill spans the cache's ids):
  // a seek positions each of them, and the spill tables' first-key index
  // (spill_format.cc) keeps those not holding the key from reading their
  // block.
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  uint64_t read = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const SpillKey key(cache_id, ids[k]);
    it->Seek(key.slice());
    // Not valid with an error status (a block failing its checksum, a table
    // file that cannot be read): the row is left to the caller, as after
    // MultiGet's error, and the next Seek starts from a clean status.
    got[k] = it->Valid() && it->key() == key.slice();
    if (got[k]) {
      ++read;
      const rocksdb::Slice v = it->value();
      found(k, std::span(reinterpret_cast<const std::byte*>(v.data()), v.size()));
    }
  }
  g_rows_read_in_place.fetch_add(read, std::memory_order_relaxed);
}

uint64_t SpillReader::RowsReadInPlace() {
  return g_rows_read_in_place.load(std::memory_order_relaxed);
}

SpillReader::CatchUp SpillReader::MaybeCatchUp() {
  return CatchUpUnlessWithin(kCatchUpIntervalMs);
}

uint64_t SpillReader::MemtableRows() { return MemtableEntries(*db_); }

SpillReader::CatchUp SpillReader::CatchUpUnlessWithin(int64_t interval_ms) {
  if (NowMs() - last_catch_up_ms_.load(std::memory_order_relaxed) < interval_ms) {
    return CatchUp::kSkipped;
  }
  bool idle = false;
  if (!catching_up_.compare_exchange_strong(idle, true)) return CatchUp::kSkipped;
  rocksdb::Status s = db_->TryCatchUpWithPrimary();
  last_catch_up_ms_.store(NowMs(), std::memory_order_relaxed);
  catching_up_.store(false);
  return s.ok() ? CatchUp::kDone : CatchUp::kFailed;
}

}  // namespace shmcache
