// A cache's index tables: the first one, sized from the budget, and each
// larger one a client asks for when the current one fills.
#include "daemon/cache_state.h"

#include <bit>
#include <random>

#include <fmt/format.h>

#include "daemon/logger.h"
#include "format/index_table.h"

namespace shmcache {

namespace {
// Names tried before giving up when another user took them: random table
// tags collide by chance only.
constexpr uint32_t kTableNameTries = 8;
}  // namespace

Status CacheState::CreateTable(uint32_t gen, uint32_t log2, MemoryAccount* account) {
  uint64_t cap = 1ULL << log2;
  size_t bytes = layout::TableFileSize(cap);
  if (!account->Reserve(bytes)) {
    return Status::FullServerCap(fmt::format(
        "cannot grow the index of cache {}: the server's memory cap is used up",
        cache_id_));
  }
  // A random tag in the name: whoever watches the shm dir cannot take the
  // name of this cache's next table ahead of it.
  std::random_device random;
  uint32_t tag = 0;
  auto name = [&](uint32_t) {
    tag = random();
    return paths_.TableFile(cache_id_, gen, tag);
  };
  ShmFile f;
  uint32_t chosen;
  std::string skipped;
  Status s =
      ShmFile::CreateFresh(name, kTableNameTries, bytes, -1, &f, &chosen, &skipped);
  if (!skipped.empty() && log_) log_->Warn("cache {}: skipped {}", cache_id_, skipped);
  if (!s.ok()) {
    account->Release(bytes);
    return s;
  }
  auto* t = reinterpret_cast<layout::TableHeader*>(f.data());
  IndexTable::Format(t, bytes, cache_id_, gen, log2);
  index_.emplace_back(t);
  tables_.push_back(std::move(f));
  AddReserved(bytes);
  header_->tables[gen].tag = tag;
  header_->tables[gen].capacity.store(cap, std::memory_order_release);
  header_->num_tables.store(gen + 1, std::memory_order_release);
  return Status::OK();
}

Status CacheState::GrowIndex(uint32_t seen, MemoryAccount* account) {
  if (destroyed_) return Status::NotFound("cache was destroyed");
  uint32_t n = header_->num_tables.load();
  if (seen != n) return Status::OK();  // somebody grew it already
  if (n >= layout::kMaxTables) {
    alloc_.MarkFull("the index reached its largest size");
    return Status::Full("the cache index reached its largest size");
  }
  uint64_t prev = header_->tables[n - 1].capacity.load();
  Status s = CreateTable(n, static_cast<uint32_t>(std::bit_width(prev)), account);
  if (s.IsFull()) {
    alloc_.MarkFull(s.message());
    // Full also reports a full shm dir; only the cap's shortage may pass.
    if (account->available() < layout::TableFileSize(prev * 2)) {
      alloc_.MarkByCap(layout::kStateFull);
    }
  }
  return s;
}

}  // namespace shmcache
