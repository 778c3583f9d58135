// Checked rows: rows that carry a checksum of their content, so that any
// process can rebuild the expected row from its id alone and check every
// read byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shmcache/cache.h"
#include "shmcache/row.h"
#include "shmcache/status.h"

namespace shmcache::test {

// Row `id` has three columns: "id" (uint64[1]), "data" (uint8[n], a slice
// of a fixed pseudo-random pool chosen by the id; n and the slice depend on
// id only) and "sum" (uint64[1], a checksum of id and data). Any process
// can rebuild the expected row from the id alone, so every read is checked
// byte for byte.
class RowMaker {
 public:
  // Rows of 8..max_data bytes of data.
  explicit RowMaker(size_t max_data = 8192);
  size_t DataBytes(uint64_t id) const;
  const uint8_t* Data(uint64_t id) const;
  uint64_t Sum(uint64_t id) const;
  // Puts row `id`.
  Status Put(Cache& cache, uint64_t id, bool* inserted = nullptr) const;
  // Puts rows `ids` with one PutBatch: the first row's status that is not
  // OK, or PutBatch's.
  Status PutBatch(Cache& cache, std::span<const uint64_t> ids) const;
  // Checks a whole row read back for `id`. "" when right, else what is
  // wrong.
  std::string Verify(uint64_t id, const RowView& row) const;
  // Checks a projection of {"sum", "data"} in that order.
  std::string VerifyProjection(uint64_t id, const RowView& row) const;
  // Encoded bytes of row `id` (what stats count).
  size_t EncodedBytes(uint64_t id) const;
  size_t max_data() const { return max_data_; }

 private:
  static constexpr size_t kSlots = 4096;
  size_t Slot(uint64_t id) const { return id % kSlots; }
  size_t max_data_;
  std::vector<uint8_t> pool_;
  std::vector<uint32_t> offset_, length_;
  std::vector<uint64_t> slot_sum_;
};

// Checksum of id and data (64-bit, FNV-1a over 8-byte words then a mix).
uint64_t Checksum(uint64_t id, const uint8_t* data, size_t n);

}  // namespace shmcache::test
