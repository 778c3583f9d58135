// BatchReader: fills caller-provided contiguous buffers (batch tensors) with
// cached rows, using worker threads: the piece a data loader is built on.
//
//   BatchReader reader(cache, /*num_threads=*/4);
//   int64_t shape[] = {224, 224, 3};
//   ColumnTarget t{"#0", DType::kUInt8, shape, images, 224 * 224 * 3};
//   std::vector<uint8_t> hit(ids.size());
//   Status s = reader.ReadInto(ids, std::span(&t, 1), hit);
//
// Thread safety: the Cache may be used concurrently by others; one
// BatchReader serves one caller at a time (ReadInto is not reentrant: give
// each concurrent caller its own BatchReader).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "shmcache/cache.h"
#include "shmcache/export.h"
#include "shmcache/status.h"
#include "shmcache/types.h"

namespace shmcache {

// Which stored dtypes a target takes besides its own. The shape always
// has to match exactly.
enum class Accept : uint8_t {
  // Only a column of the target's dtype.
  kExact = 0,
  // Also the same bytes under another name, as numpy holds them (it has
  // neither type): bfloat16 into a uint16 target, bytes into uint8.
  kSameBytes = 1,
  // Also the unsigned types PyTorch 1.13 lacks, converted as the Python
  // package hands them out: uint16 widened into an int32 target, uint32
  // widened into int64, uint64's bits into int64 (values above 2**63 wrap).
  kTorch = 2,
};

// How the Python package names the column of a Python number (an int
// label): the name, then this suffix (clients/python/shmcache/row_model.h).
// Such a column is read into a target of the plain name like any other.
inline constexpr std::string_view kNumberSuffix = "\x1fpy";

// Where one column of a batch goes: row i lands at
// base + i * row_stride_bytes, as `dtype` (converted when `accept` takes a
// narrower stored type). A row matches only when its column `name` (or
// `name` + kNumberSuffix) has this shape (per row, without the batch dim)
// and a dtype the target takes (Takes below).
// Nothing is owned; everything must outlive the ReadInto call.
struct ColumnTarget {
  std::string_view name;
  DType dtype = DType::kUInt8;
  std::span<const int64_t> shape;
  void* base = nullptr;
  size_t row_stride_bytes = 0;
  Accept accept = Accept::kExact;
};

// Whether a column stored as `stored` fills a target of dtype `target`
// that accepts `accept`: the one statement of the dtype rule.
SHMCACHE_EXPORT bool Takes(DType target, Accept accept, DType stored);

// ReadInto's verdict on each row of a batch (hit[i]).
inline constexpr uint8_t kRowMissing = 0;      // not cached (a miss)
inline constexpr uint8_t kRowRead = 1;         // copied into the targets (a hit)
inline constexpr uint8_t kRowOtherLayout = 2;  // cached, but a target's column is
                                               // absent or of another dtype/shape

// How one target's column is stored, as ReadInto saw it.
struct StoredColumn {
  static constexpr size_t kNoRow = ~size_t{0};
  // The batch position of the first cached row (lowest position) that has
  // the column; kNoRow when none has it (dtype and shape then mean nothing).
  size_t row = kNoRow;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
};

class SHMCACHE_EXPORT BatchReader {
 public:
  // num_threads: how many threads copy rows, the calling thread included
  // (num_threads - 1 are started here and kept until destruction; fewer
  // when the system refuses to start more, see num_threads()); 0 or 1: all
  // on the calling thread. REQUIRES: cache outlives the reader.
  BatchReader(Cache* cache, int num_threads);
  ~BatchReader();
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  // For each ids[i]: when the row is cached (in memory, or spilled: those
  // rows are read with one Cache::GetBatch, from the spill database in this
  // process, by the calling thread after the memory rows) and each
  // target's column exists with its shape and a dtype it takes, the
  // columns are copied (converted where the target widens them) to their
  // targets' row i and hit[i] = kRowRead. Otherwise hit[i] is kRowMissing
  // (not cached, or a spilled row that failed its check and was dropped:
  // Cache::Get's RowDropped) or kRowOtherLayout (cached, not matching), and row i of
  // every target is left untouched: never a partial write. Every id is
  // looked up once, and counted once, as a hit or a miss (CacheStats).
  // `stored`, when not empty (one per target), receives how each target's
  // column is stored (StoredColumn), so a caller can say why rows did not
  // match. Rows are split among the threads, each copying whole rows (one
  // thread per 256 KB of target rows at most: a smaller batch is copied by
  // the calling thread alone); memory rows are found with ViewBatch. In a
  // forked child the reader starts its own threads.
  // count=false: nothing is counted (Cache::ViewBatchUncounted and
  // GetBatchUncounted): for a reader whose reads of these rows were
  // counted already, as a loader reading back the rows its workers
  // computed and stored after its own read of them missed.
  // Errors: what the Cache returns when it cannot be used (e.g. InvalidArgument
  // once closed, NotFound for a destroyed session) or when a spilled row
  // cannot be fetched (Unavailable); then every hit[i] = kRowMissing and
  // rows already copied may have been written. InvalidArgument, with
  // nothing read or written, when hit does not hold ids.size() elements or
  // a non-empty stored does not hold targets.size().
  // REQUIRES: each target's buffer holds ids.size() rows of
  // row_stride_bytes >= its row's bytes (in the target's dtype).
  Status ReadInto(std::span<const uint64_t> ids, std::span<const ColumnTarget> targets,
                  std::span<uint8_t> hit, std::span<StoredColumn> stored = {},
                  bool count = true);

  // How many threads copy rows: as asked, or fewer when the system refused
  // a thread (each refused helper is one less; the caller always copies).
  int num_threads() const;

 private:
  class Pool;
  struct Share;
  // In a forked child: new helper threads (the parent's are not there).
  SHMCACHE_LOCAL void AfterFork();
  // Reads the rows at positions `where` (on disk) with one GetBatch.
  SHMCACHE_LOCAL Status ReadSpilled(std::span<const uint64_t> ids,
                                    const std::vector<size_t>& where,
                                    std::span<const ColumnTarget> targets, uint8_t* hit,
                                    Share* seen, bool count);

  Cache* cache_;
  uint64_t fork_gen_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace shmcache
