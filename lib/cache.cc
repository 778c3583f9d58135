// Cache: the public handle; every call forwards to CacheImpl (cache_impl.h),
// whose work lives in cache_impl.cc (attach, statistics), cache_read.cc,
// cache_put.cc and cache_spill.cc. Get(id) and View(id) are defined in
// cache_read.cc, where the hit path inlines into them.

#include "shmcache/cache.h"

#include <fmt/format.h>

#include "lib/cache_impl.h"

namespace shmcache {

namespace {

// InvalidArgument unless a batch's `what` holds one element per id.
Status CheckBatchSize(const char* call, size_t ids, size_t n, const char* what) {
  if (n == ids) return Status::OK();
  return Status::InvalidArgument(fmt::format("{}: {} ids but {} {}", call, ids, n, what));
}

// CheckBatchSize of a read's two outputs: its rows or views, then statuses.
Status CheckReadBatch(const char* call, size_t ids, size_t out, const char* what,
                      size_t statuses) {
  Status s = CheckBatchSize(call, ids, out, what);
  if (s.ok()) s = CheckBatchSize(call, ids, statuses, "statuses");
  return s;
}

}  // namespace

Cache::Cache(std::shared_ptr<CacheImpl> impl) : impl_(std::move(impl)) {}
Cache::~Cache() = default;

Status Cache::Put(uint64_t id, std::span<const ColumnRef> columns, bool* inserted) {
  return impl_->Put(id, columns, inserted);
}

Status Cache::Put(uint64_t id, const void* data, size_t nbytes, bool* inserted) {
  int64_t shape[1] = {static_cast<int64_t>(nbytes)};
  ColumnRef col{"data", DType::kUInt8, shape, data, nbytes};
  return impl_->Put(id, std::span(&col, 1), inserted);
}

Status Cache::PutBatch(std::span<const uint64_t> ids,
                       std::span<const std::span<const ColumnRef>> rows,
                       std::span<Status> statuses, std::span<bool> inserted) {
  Status s = CheckBatchSize("PutBatch", ids.size(), rows.size(), "rows");
  if (s.ok()) s = CheckBatchSize("PutBatch", ids.size(), statuses.size(), "statuses");
  if (s.ok() && !inserted.empty()) {
    s = CheckBatchSize("PutBatch", ids.size(), inserted.size(), "inserted flags");
  }
  if (!s.ok()) return s;
  return impl_->PutBatch(ids, rows, statuses.data(),
                         inserted.empty() ? nullptr : inserted.data());
}

Status Cache::Get(uint64_t id, std::span<const std::string_view> columns, Row* out) {
  return impl_->Get(id, columns, true, out);
}

Status Cache::GetBatch(std::span<const uint64_t> ids, std::span<Row> rows,
                       std::span<Status> statuses) {
  Status s = CheckReadBatch("GetBatch", ids.size(), rows.size(), "rows", statuses.size());
  if (!s.ok()) return s;
  return impl_->GetBatch(ids, rows.data(), statuses.data());
}

Status Cache::GetBatchUncounted(std::span<const uint64_t> ids, std::span<Row> rows,
                                std::span<Status> statuses) {
  Status s = CheckReadBatch("GetBatchUncounted", ids.size(), rows.size(), "rows",
                            statuses.size());
  if (!s.ok()) return s;
  return impl_->GetBatch(ids, rows.data(), statuses.data(), false);
}

Status Cache::ViewBatch(std::span<const uint64_t> ids, std::span<RowView> views,
                        std::span<Status> statuses) {
  Status s =
      CheckReadBatch("ViewBatch", ids.size(), views.size(), "views", statuses.size());
  if (!s.ok()) return s;
  return impl_->ViewBatch(ids, views.data(), statuses.data());
}

Status Cache::ViewBatchUncounted(std::span<const uint64_t> ids, std::span<RowView> views,
                                 std::span<Status> statuses) {
  Status s = CheckReadBatch("ViewBatchUncounted", ids.size(), views.size(), "views",
                            statuses.size());
  if (!s.ok()) return s;
  return impl_->ViewBatch(ids, views.data(), statuses.data(), false);
}

bool Cache::Contains(uint64_t id) { return impl_->Contains(id); }
Status Cache::GetStats(CacheStats* out) { return impl_->GetStats(out); }
bool Cache::IsFull() const { return impl_->IsFull(); }
uint64_t Cache::SpilledRowsDropped() const { return impl_->SpilledRowsDropped(); }
uint32_t Cache::cache_id() const { return impl_->cache_id(); }
uint32_t Cache::session_id() const { return impl_->session_id(); }
void Cache::Close() { impl_->Close(); }

}  // namespace shmcache
