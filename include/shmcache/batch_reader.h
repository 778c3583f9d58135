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

// Where one column of a batch goes: row i's bytes land at
// base + i * row_stride_bytes. A row matches only when its column `name`
// has exactly this dtype and this shape (per row, without the batch dim).
// Nothing is owned; everything must outlive the ReadInto call.
struct ColumnTarget {
  std::string_view name;
  DType dtype = DType::kUInt8;
  std::span<const int64_t> shape;
  void* base = nullptr;
  size_t row_stride_bytes = 0;
};

class SHMCACHE_EXPORT BatchReader {
 public:
  // num_threads: how many threads copy rows, the calling thread included
  // (num_threads - 1 are started here and kept until destruction); 0 or 1:
  // all on the calling thread. REQUIRES: cache outlives the reader.
  BatchReader(Cache* cache, int num_threads);
  ~BatchReader();
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  // For each ids[i]: when the row is cached (in memory, or spilled: those
  // rows are read with one Cache::GetBatch, from the spill database in this
  // process, by the calling thread after the memory rows) and each
  // target's column exists with exactly its dtype and shape, the columns'
  // bytes are copied to their targets' row i and hit[i] = 1. Otherwise
  // hit[i] = 0 and row i of every target is left untouched (a column of
  // another dtype or shape makes the row a miss for this call, never a
  // partial write). Rows are split among the threads, each copying whole
  // rows (one thread per 256 KB of target rows at most: a smaller batch is
  // copied by the calling thread alone); memory rows are found with
  // ViewBatch. In a forked child the reader starts its own threads.
  // Errors: what the Cache returns when it cannot be used (e.g. InvalidArgument
  // once closed, NotFound for a destroyed session) or when a spilled row
  // cannot be fetched (Unavailable); then every hit[i] = 0 and rows already
  // copied may have been written. InvalidArgument, with nothing read or
  // written, when hit does not hold ids.size() elements.
  // REQUIRES: each target's buffer holds ids.size() rows of
  // row_stride_bytes >= its row's bytes.
  Status ReadInto(std::span<const uint64_t> ids, std::span<const ColumnTarget> targets,
                  std::span<uint8_t> hit);

  int num_threads() const;

 private:
  class Pool;
  // In a forked child: new helper threads (the parent's are not there).
  SHMCACHE_LOCAL void AfterFork();
  // Reads the rows at positions `where` (on disk) with one GetBatch.
  SHMCACHE_LOCAL Status ReadSpilled(std::span<const uint64_t> ids,
                                    const std::vector<size_t>& where,
                                    std::span<const ColumnTarget> targets, uint8_t* hit);

  Cache* cache_;
  uint64_t fork_gen_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace shmcache
