// Reading rows: RowView (non-owning, possibly pointing into shared memory)
// and Row (owns a private copy).
//
// A row is a list of named columns, each a tensor (dtype, shape, bytes).
// Column data is 8-byte aligned, so a view can be handed to numpy or
// PyTorch without a copy.
//
// Lifetime of a view (the one statement of it; cache.h and the Python
// package refer here). What a RowView's bytes are, and how long they stay
// valid, depends on where it came from:
// - in_shared_memory() true (Cache::View or ViewBatch of a row in memory):
//   the cache's shared memory, mapped read-only in this process. A row is
//   never changed or removed once stored, so the bytes stay valid and equal
//   until the Cache that produced the view is destroyed; Close(), the
//   session's destruction and the daemon's exit do not end them (the memory
//   of a destroyed session is freed only when its last mapping goes, so
//   drop such views soon). A forked child keeps them too.
// - in_shared_memory() false from Cache::View (a row the cache spilled to
//   disk): a buffer of the calling thread, valid until that thread's next
//   View of a spilled row (of any Cache) or its exit. ViewBatch never
//   returns such a view (it answers NotSupported for a spilled row).
// - Row::view(): the Row's own buffer, valid while the Row lives and until
//   it is read into again.
// After a failed read the Row or RowView passed in is empty
// (num_columns() == 0); a Row keeps its buffer for the next read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "shmcache/export.h"
#include "shmcache/types.h"

namespace shmcache {

struct ColumnView {
  std::string_view name;
  DType dtype = DType::kUInt8;
  std::span<const int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
};

// A decoded row over bytes it does not own (how long they stay valid: see
// the top of this file); the bytes are read-only.
// Thread safety: const methods may be called concurrently.
class SHMCACHE_EXPORT RowView {
 public:
  RowView() = default;

  size_t num_columns() const { return num_columns_; }
  // REQUIRES: i < num_columns().
  ColumnView column(size_t i) const;
  // The column named `name`, if present.
  std::optional<ColumnView> find(std::string_view name) const;
  // The whole encoded row (header, descriptors, data).
  std::span<const std::byte> encoded() const { return bytes_; }
  bool empty() const { return bytes_.empty(); }
  // True when the bytes are the cache's shared memory (a row in memory,
  // from Cache::View / ViewBatch), mapped read-only in this process: a
  // write through them faults, and they outlive the call that returned
  // them (see the top of this file). False for a private copy (a Row, or
  // the per-thread buffer a spilled row is viewed in).
  bool in_shared_memory() const { return in_shared_memory_; }

 private:
  friend class RowCodec;
  friend class CacheImpl;
  std::span<const std::byte> bytes_;
  size_t num_columns_ = 0;
  bool in_shared_memory_ = false;
};

// A row copied out of the cache into private memory. Reusing one Row for
// many gets avoids allocation once its buffer is large enough.
class SHMCACHE_EXPORT Row {
 public:
  Row() = default;
  Row(const Row&) = delete;
  Row& operator=(const Row&) = delete;
  // The buffer moves with its view; the Row moved from is empty (no
  // columns), not a view of the buffer it handed over.
  Row(Row&& o) noexcept : buf_(std::move(o.buf_)), view_(std::exchange(o.view_, {})) {}
  Row& operator=(Row&& o) noexcept {
    if (this != &o) {
      buf_ = std::move(o.buf_);
      view_ = std::exchange(o.view_, {});
    }
    return *this;
  }

  const RowView& view() const { return view_; }
  size_t num_columns() const { return view_.num_columns(); }
  ColumnView column(size_t i) const { return view_.column(i); }
  std::optional<ColumnView> find(std::string_view name) const { return view_.find(name); }

 private:
  friend class CacheImpl;
  friend class RowCodec;
  // uint64_t storage keeps the copy 8-byte aligned.
  std::vector<uint64_t> buf_;
  RowView view_;
};

}  // namespace shmcache
