// kBatchWindow: how many ids a batched read or put looks up at once, and
// how many rows a PutBatch publishes between two counts of its puts
// (CacheImpl's GetBatch and PutBatch, and the windows BatchReader hands to
// ViewBatch, which pipelines its lookups: CacheImpl::kRowsAhead): enough
// ids to overlap their memory misses (every index slot is prefetched
// before any is probed, every row header before any is read), few enough
// that the lines prefetched are still in cache when they are used.
#pragma once

#include <cstddef>

namespace shmcache {

inline constexpr size_t kBatchWindow = 32;

}  // namespace shmcache
