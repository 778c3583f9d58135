// Cache: the public handle; every call forwards to CacheImpl (cache_impl.h),
// whose work lives in cache_impl.cc (attach, mapping), cache_read.cc,
// cache_put.cc and cache_spill.cc.

#include "shmcache/cache.h"

#include "cache_impl.h"

namespace shmcache {

Cache::Cache(std::shared_ptr<CacheImpl> impl) : impl_(std::move(impl)) {}
Cache::~Cache() = default;

Status Cache::Put(uint64_t id, std::span<const ColumnRef> columns,
                  bool* inserted) {
  return impl_->Put(id, columns, inserted);
}

Status Cache::Put(uint64_t id, const void* data, size_t nbytes,
                  bool* inserted) {
  int64_t shape[1] = {static_cast<int64_t>(nbytes)};
  ColumnRef col{"data", DType::kUInt8, shape, data, nbytes};
  return impl_->Put(id, std::span(&col, 1), inserted);
}

Status Cache::PutBatch(std::span<const uint64_t> ids,
                       std::span<const std::span<const ColumnRef>> rows,
                       Status* statuses, bool* inserted) {
  return impl_->PutBatch(ids, rows, statuses, inserted);
}

Status Cache::Get(uint64_t id, Row* out) { return impl_->Get(id, {}, false, out); }

Status Cache::Get(uint64_t id, std::span<const std::string_view> columns,
                  Row* out) {
  return impl_->Get(id, columns, true, out);
}

Status Cache::View(uint64_t id, RowView* out) { return impl_->View(id, out); }
Status Cache::GetBatch(std::span<const uint64_t> ids, Row* rows, Status* statuses) {
  return impl_->GetBatch(ids, rows, statuses);
}
Status Cache::ViewBatch(std::span<const uint64_t> ids, RowView* views,
                        Status* statuses) {
  return impl_->ViewBatch(ids, views, statuses);
}
bool Cache::Contains(uint64_t id) { return impl_->Contains(id); }
Status Cache::GetStats(CacheStats* out) { return impl_->GetStats(out); }
bool Cache::IsFull() const { return impl_->IsFull(); }
uint32_t Cache::cache_id() const { return impl_->cache_id(); }
uint32_t Cache::session_id() const { return impl_->session_id(); }
void Cache::Close() { impl_->Close(); }

}  // namespace shmcache

