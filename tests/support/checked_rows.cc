#include "tests/support/checked_rows.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace shmcache::test {

namespace {
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
uint64_t DataHash(const uint8_t* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ULL;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ULL;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ULL;
  return Mix(h ^ n);
}
}  // namespace

uint64_t Checksum(uint64_t id, const uint8_t* data, size_t n) {
  return Mix(id) ^ DataHash(data, n);
}

RowMaker::RowMaker(size_t max_data)
    : max_data_(max_data),
      pool_(max_data * 2 + kSlots * 8),
      offset_(kSlots),
      length_(kSlots),
      slot_sum_(kSlots) {
  uint64_t x = 42;
  for (size_t i = 0; i < pool_.size(); i += 8) {
    x = Mix(x);
    std::memcpy(&pool_[i], &x, std::min<size_t>(8, pool_.size() - i));
  }
  for (size_t s = 0; s < kSlots; ++s) {
    uint64_t r = Mix(s * 7919 + 1);
    length_[s] = static_cast<uint32_t>(8 + r % (max_data_ - 7));
    offset_[s] = static_cast<uint32_t>((r >> 32) % (pool_.size() - max_data_));
    slot_sum_[s] = DataHash(&pool_[offset_[s]], length_[s]);
  }
}

size_t RowMaker::DataBytes(uint64_t id) const { return length_[Slot(id)]; }
const uint8_t* RowMaker::Data(uint64_t id) const { return &pool_[offset_[Slot(id)]]; }
uint64_t RowMaker::Sum(uint64_t id) const { return Mix(id) ^ slot_sum_[Slot(id)]; }

size_t RowMaker::EncodedBytes(uint64_t id) const {
  auto pad = [](size_t n) { return (n + 7) & ~size_t{7}; };
  // header + three descriptors (8 + 8 shape + padded name) + data.
  return 16 + 3 * 24 + 8 + 8 + pad(DataBytes(id));
}

Status RowMaker::Put(Cache& cache, uint64_t id, bool* inserted) const {
  static const int64_t kOne[1] = {1};
  uint64_t sum = Sum(id);
  int64_t n[1] = {static_cast<int64_t>(DataBytes(id))};
  ColumnRef cols[3] = {
      {"id", DType::kUInt64, kOne, &id, 8},
      {"data", DType::kUInt8, n, Data(id), DataBytes(id)},
      {"sum", DType::kUInt64, kOne, &sum, 8},
  };
  return cache.Put(id, cols, inserted);
}

Status RowMaker::PutBatch(Cache& cache, std::span<const uint64_t> ids) const {
  static const int64_t kOne[1] = {1};
  const size_t n = ids.size();
  std::vector<uint64_t> sums(n);
  std::vector<int64_t> lengths(n);
  std::vector<ColumnRef> cols(3 * n);
  std::vector<std::span<const ColumnRef>> rows(n);
  for (size_t i = 0; i < n; ++i) {
    sums[i] = Sum(ids[i]);
    lengths[i] = static_cast<int64_t>(DataBytes(ids[i]));
    cols[3 * i] = {"id", DType::kUInt64, kOne, &ids[i], 8};
    cols[3 * i + 1] = {"data", DType::kUInt8, std::span(&lengths[i], 1), Data(ids[i]),
                       DataBytes(ids[i])};
    cols[3 * i + 2] = {"sum", DType::kUInt64, kOne, &sums[i], 8};
    rows[i] = std::span(&cols[3 * i], 3);
  }
  std::vector<Status> statuses(n);
  Status s = cache.PutBatch(ids, rows, statuses);
  for (size_t i = 0; s.ok() && i < n; ++i) s = statuses[i];
  return s;
}

static std::string CheckColumns(const RowMaker& m, uint64_t id, const ColumnView* idc,
                                const ColumnView& data, const ColumnView& sum) {
  if (idc) {
    if (idc->dtype != DType::kUInt64 || idc->nbytes != 8) {
      return "column 'id' has the wrong type or size";
    }
    uint64_t got;
    std::memcpy(&got, idc->data, 8);
    if (got != id) return fmt::format("column 'id' holds {}", got);
  }
  if (data.dtype != DType::kUInt8 || data.nbytes != m.DataBytes(id) ||
      data.shape.size() != 1 || data.shape[0] != static_cast<int64_t>(m.DataBytes(id))) {
    return fmt::format("column 'data' has {} bytes, {} expected", data.nbytes,
                       m.DataBytes(id));
  }
  if (sum.dtype != DType::kUInt64 || sum.nbytes != 8) {
    return "column 'sum' has the wrong type or size";
  }
  uint64_t s;
  std::memcpy(&s, sum.data, 8);
  auto* bytes = reinterpret_cast<const uint8_t*>(data.data);
  if (Checksum(id, bytes, data.nbytes) != s) return "checksum mismatch (torn row)";
  if (s != m.Sum(id)) return "stored checksum is not row's";
  if (std::memcmp(bytes, m.Data(id), data.nbytes) != 0) {
    return "data differs from what was written";
  }
  return "";
}

std::string RowMaker::Verify(uint64_t id, const RowView& row) const {
  if (row.num_columns() != 3) {
    return fmt::format("row has {} columns, 3 expected", row.num_columns());
  }
  ColumnView idc = row.column(0), data = row.column(1), sum = row.column(2);
  if (idc.name != "id" || data.name != "data" || sum.name != "sum") {
    return "column names differ";
  }
  return CheckColumns(*this, id, &idc, data, sum);
}

std::string RowMaker::VerifyProjection(uint64_t id, const RowView& row) const {
  if (row.num_columns() != 2) {
    return fmt::format("projection has {} columns, 2 expected", row.num_columns());
  }
  ColumnView sum = row.column(0), data = row.column(1);
  if (sum.name != "sum" || data.name != "data") return "projection order differs";
  return CheckColumns(*this, id, nullptr, data, sum);
}

}  // namespace shmcache::test
