// Cache::ClaimBuild, Seal and GetSealedRows: the records of a streaming
// cache, as rows above kMaxRowId. Their ids and columns are those the
// Python package wrote before these existed (torch.py's CachedIterableDataset),
// so caches sealed then read as sealed now, and the reverse.
#include "shmcache/cache.h"

#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>

#include "lib/cache_impl.h"

namespace shmcache {

namespace {

// The builder's claim: column "builder", int64[1], its pid.
constexpr uint64_t kBuilderRowId = ~uint64_t{0};
// The seal: column "count", a 0-d int64, the number of rows.
constexpr uint64_t kSealedRowId = ~uint64_t{0} - 1;
static_assert(kBuilderRowId > kMaxRowId && kSealedRowId > kMaxRowId);

constexpr std::string_view kBuilderColumn = "builder";
constexpr std::string_view kCountColumn = "count";

}  // namespace

Status Cache::ClaimBuild(bool* claimed) {
  static constexpr int64_t kOne[1] = {1};
  const int64_t pid = getpid();
  const ColumnRef column{kBuilderColumn, DType::kInt64, kOne, &pid, sizeof pid};
  *claimed = false;
  bool inserted = false;
  Status s = impl_->Put(kBuilderRowId, std::span(&column, 1), &inserted);
  if (s.ok()) *claimed = inserted;
  return s;
}

Status Cache::Seal(uint64_t num_rows) {
  const auto count = static_cast<int64_t>(num_rows);
  const ColumnRef column{kCountColumn, DType::kInt64, {}, &count, sizeof count};
  return impl_->Put(kSealedRowId, std::span(&column, 1), nullptr);
}

Status Cache::GetSealedRows(uint64_t* num_rows) {
  Row row;
  Status s = impl_->Get(kSealedRowId, {}, false, &row);
  if (!s.ok()) {
    if (!s.IsNotFound()) return s;
    // A destroyed session is NotFound too: that, not "not sealed", is why.
    Status usable = impl_->Usable();
    return usable.ok() ? Status::NotFound("the cache is not sealed") : usable;
  }
  std::optional<ColumnView> c = row.find(kCountColumn);
  if (!c || c->dtype != DType::kInt64 || c->nbytes != sizeof(int64_t)) {
    return Status::Corruption("the seal record of the cache is not one (row " +
                              std::to_string(kSealedRowId) + ")");
  }
  int64_t count;
  std::memcpy(&count, c->data, sizeof count);
  if (count < 0) return Status::Corruption("the seal record holds a negative row count");
  *num_rows = static_cast<uint64_t>(count);
  return Status::OK();
}

}  // namespace shmcache
