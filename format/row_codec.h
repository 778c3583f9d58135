// RowCodec: the byte format of a row, shared by shared memory, the spill
// store and the wire.
//
//   RowHeader (16 bytes)  total_bytes u32 | num_columns u16 | version u8 |
//                         flags u8 | key u64
//   per column            dtype u8 | ndim u8 | name_len u8 | 0 u8 |
//                         data_offset u32 | shape int64[ndim] |
//                         name, zero-padded to 8
//   column data           each at its data_offset, 8-byte aligned
//
// A column's byte count is derived (itemsize x product of shape), so it
// costs no space. Decode validates every field against the bytes it was
// given, so a corrupt or hostile buffer yields Corruption, never a read out
// of bounds.
// Thread safety: stateless; all functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "format/row_copy.h"
#include "shmcache/row.h"
#include "shmcache/status.h"
#include "shmcache/types.h"

namespace shmcache {

inline constexpr uint8_t kRowVersion = 1;
inline constexpr size_t kRowHeaderBytes = 16;
inline constexpr size_t kMaxColumns = kMaxColumnsPerRow;
inline constexpr size_t kMaxRowBytes = 0xFFFFFFF8u;

class RowCodec {
 public:
  // Checks the columns and computes the encoded size (a multiple of 8).
  static Status EncodedSize(std::span<const ColumnRef> columns, size_t* size);
  // REQUIRES: EncodedSize(columns) returned OK with `size`; dst is 8-byte
  // aligned with `size` writable bytes.
  static void Encode(uint64_t key, std::span<const ColumnRef> columns, std::byte* dst,
                     size_t size);
  // The same encoding in pieces, for a writer that gathers them (pwritev):
  // the row's first HeadBytes bytes (its header and the columns'
  // descriptors), which EncodeHead writes to dst, then each column's data
  // in order, each followed by zeros up to PaddedBytes(nbytes).
  // REQUIRES for EncodeHead: as for Encode, with HeadBytes(columns)
  // writable bytes at dst. EncodeHead returns HeadBytes(columns), where
  // the first column's data goes.
  static size_t HeadBytes(std::span<const ColumnRef> columns);
  static size_t PaddedBytes(size_t nbytes);
  static size_t EncodeHead(uint64_t key, std::span<const ColumnRef> columns,
                           std::byte* dst, size_t size);
  // Validates the row at p (at most max_bytes readable) and views it.
  static Status Decode(const std::byte* p, size_t max_bytes, RowView* out);
  // The hit path's check of a row in the cache's shared memory: header
  // fields in bounds and the row's id equal to `key`. Descriptors are
  // checked by the RowView accessors as they are read. False on any
  // mismatch; *out views the row (in_shared_memory) otherwise.
  // Inline, with Copy and Reserve: they are the single-row hit path, whose
  // length decides whether the next hit's misses overlap this one's copy
  // (docs/hit-path.md).
  static bool DecodeHeader(const std::byte* p, size_t max_bytes, uint64_t key,
                           RowView* out) {
    if (max_bytes < kRowHeaderBytes) return false;
    const auto total = Field<uint32_t>(p);
    const auto ncols = Field<uint16_t>(p + 4);
    if (total < kRowHeaderBytes || total > max_bytes || total % 8 != 0 ||
        Field<uint8_t>(p + 6) != kRowVersion || ncols == 0 || ncols > kMaxColumns ||
        Field<uint64_t>(p + 8) != key) {
      return false;
    }
    out->bytes_ = std::span<const std::byte>(p, total);
    out->num_columns_ = ncols;
    out->in_shared_memory_ = true;
    return true;
  }
  static uint64_t KeyOf(const RowView& v);
  // Whether the n bytes at p are exactly one whole row (Decode) of id
  // `key`: what a row from outside (a client's put, the spill store's
  // read) must be before it is believed.
  static bool IsRowOf(const std::byte* p, size_t n, uint64_t key);
  // Copies a whole row into out (reusing its buffer), as one of the
  // `rows_in_call` rows a call copies (1 for Get, the batch's size for
  // GetBatch): a large row of a call whose rows exceed the CPU's cache share
  // with streaming stores (row_copy.h).
  // The view is set before the bytes are copied: on the hit path nothing
  // then stays live across the copy's call but the caller's own state.
  static void Copy(const RowView& in, Row* out, size_t rows_in_call = 1) {
    const std::byte* src = in.bytes_.data();
    const size_t n = in.bytes_.size();
    std::byte* dst = Reserve(out, n);
    out->view_.bytes_ = std::span<const std::byte>(dst, n);
    out->view_.num_columns_ = in.num_columns_;
    CopyRowBytes(dst, src, n, rows_in_call);
  }
  // Copies the named columns, in that order, into out. ColumnNotFound
  // naming the first absent column (out is then unchanged).
  static Status Project(const RowView& in, std::span<const std::string_view> names,
                        Row* out);
  // Rebuilds *out's view over its own buffer after the buffer was filled.
  static Status Adopt(Row* out, size_t bytes);
  // Resizes out's buffer to hold `bytes` and returns it.
  static std::byte* Reserve(Row* out, size_t bytes) {
    // In bytes: the buffer's byte size is its two pointers' difference.
    if (out->buf_.size() * sizeof(uint64_t) < bytes) out->buf_.resize((bytes + 7) / 8);
    return reinterpret_cast<std::byte*>(out->buf_.data());
  }

 private:
  template <typename T>
  static T Field(const std::byte* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
};

}  // namespace shmcache
