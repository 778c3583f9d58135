// A cache's index tables: the first one, sized from the budget, and each
// larger one a client asks for when the current one fills, into which the
// rows of the older ones are copied, so that a lookup probes one table.
#include "daemon/cache_state.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
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
  if (s.ok()) CompactIndex(account);
  if (s.IsFull()) {
    alloc_.MarkFull(s.message());
    // Full also reports a full shm dir; only the cap's shortage may pass.
    if (account->available() < layout::TableFileSize(prev * 2)) {
      alloc_.MarkByCap(layout::kStateFull);
    }
  }
  return s;
}

void CacheState::CompactIndex(MemoryAccount* account) {
  // The newest table holds about as many rows as all tables before it
  // (each older one was copied into the next), and is twice the largest:
  // the copy fills it to 3/8, under its limit of 3/4.
  const uint32_t newest = static_cast<uint32_t>(index_.size()) - 1;
  const uint32_t first = header_->first_table.load(std::memory_order_relaxed);
  // CreateTable stored the count of tables; this fence orders that store
  // before the copy's loads of the older slots, as TableSet::Publish's
  // fence orders a writer's slot store before its load of the count. A
  // writer that published in an older table either has its row seen by
  // the copy below or sees the newer table and publishes there too.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (uint32_t g = first; g < newest; ++g) {
    if (!index_[g].CopyInto(&index_[newest])) {
      // Filled by writers during the copy (or tables adopted from a
      // daemon that did not copy): lookups keep probing every table.
      if (log_)
        log_->Warn("{}: index tables not compacted: table {} filled", Label(), newest);
      return;
    }
  }
  // Every row of the older tables is in the newest: lookups may stop there.
  header_->first_table.store(newest, std::memory_order_release);
  // Those compacted away before too: a read of a freed page (a reader or
  // writer whose tables were stale) allocates it again on tmpfs, bytes no
  // longer counted; freeing an already free page costs next to nothing.
  for (uint32_t g = 0; g < newest; ++g) FreeTableSlots(g);
  uint64_t freed = 0;
  for (uint32_t g = first; g < newest; ++g) freed += tables_[g].size() - TableBytes(g);
  file_bytes_ -= freed;
  account->Release(freed);
  PublishReserved();
}

void CacheState::FreeTableSlots(uint32_t g) {
  // The pages past the first go back to the system (a reader still probing
  // the table reads zeros, empty slots: a miss, then the full path finds the
  // row in the newest), and the first page's slots are emptied so that no
  // stale location is left there. The header (the first page) stays, for
  // the daemon that adopts the file.
  const size_t page = 4096;
  const size_t size = tables_[g].size();
  if (size > page) {
    if (madvise(tables_[g].data() + page, size - page, MADV_REMOVE) != 0 && log_) {
      log_->Warn("{}: could not free index table {}'s slots: errno {}", Label(), g,
                 errno);
    }
  }
  auto* slots =
      layout::TableSlots(reinterpret_cast<layout::TableHeader*>(tables_[g].data()));
  const size_t in_first_page =
      (std::min(size, page) - sizeof(layout::TableHeader)) / sizeof(layout::Slot);
  for (size_t i = 0; i < in_first_page; ++i) {
    slots[i].loc.store(layout::kEmpty, std::memory_order_release);
  }
}

std::span<IndexTable> CacheState::LiveIndex() {
  const uint32_t first =
      header_ ? header_->first_table.load(std::memory_order_relaxed) : 0;
  return std::span(index_).subspan(std::min<size_t>(first, index_.size()));
}

uint64_t CacheState::TableBytes(uint32_t g) const {
  const uint64_t size = tables_[g].size();
  const uint32_t first =
      header_ ? header_->first_table.load(std::memory_order_relaxed) : 0;
  return g < first ? std::min<uint64_t>(size, 4096) : size;
}

}  // namespace shmcache
