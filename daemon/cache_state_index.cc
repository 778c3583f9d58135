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
#include <string>
#include <utility>

#include <fmt/format.h>

#include "daemon/logger.h"
#include "format/index_table.h"
#include "format/shm_file.h"

namespace shmcache {

namespace {
// Names tried before giving up when another user took them: random table
// tags collide by chance only.
constexpr uint32_t kTableNameTries = 8;
}  // namespace

Status CacheState::CreateTable(uint32_t gen, uint32_t log2, MemoryAccount* account) {
  const Growth g{.gen = gen, .log2 = log2, .bytes = layout::TableFileSize(1ULL << log2)};
  if (!account->Reserve(g.bytes)) return IndexCapUsedUp();
  ShmFile f;
  uint32_t tag = 0;
  std::string skipped;
  Status s = MakeTable(paths_, cache_id_, g, &f, &tag, &skipped);
  if (!skipped.empty() && log_) log_->Warn("cache {}: skipped {}", cache_id_, skipped);
  if (!s.ok()) {
    account->Release(g.bytes);
    return s;
  }
  AddReserved(g.bytes);
  InstallTable(gen, std::move(f), tag);
  return Status::OK();
}

Status CacheState::MakeTable(const InstancePaths& paths, uint32_t cache_id,
                             const Growth& g, ShmFile* file, uint32_t* tag,
                             std::string* skipped) {
  // A random tag in the name: whoever watches the shm dir cannot take the
  // name of this cache's next table ahead of it.
  std::random_device random;
  auto name = [&](uint32_t) {
    *tag = random();
    return paths.TableFile(cache_id, g.gen, *tag);
  };
  uint32_t chosen;
  Status s =
      ShmFile::CreateFresh(name, kTableNameTries, g.bytes, -1, file, &chosen, skipped);
  if (!s.ok()) return s;
  // Its pages, cleared by Create, mapped here now, so that the copy into
  // it faults none in (under the lock, where a fault per page cost as much
  // as the inserts).
  PopulateForWrite(file->data(), file->size());
  IndexTable::Format(reinterpret_cast<layout::TableHeader*>(file->data()), g.bytes,
                     cache_id, g.gen, g.log2);
  return Status::OK();
}

void CacheState::InstallTable(uint32_t gen, ShmFile f, uint32_t tag) {
  // Their room first: past it nothing throws, so that index_ and tables_
  // stay in step.
  index_.reserve(index_.size() + 1);
  tables_.reserve(tables_.size() + 1);
  index_.emplace_back(reinterpret_cast<layout::TableHeader*>(f.data()));
  const uint64_t cap = index_.back().capacity();
  tables_.push_back(std::move(f));
  header_->tables[gen].tag = tag;
  header_->tables[gen].capacity.store(cap, std::memory_order_release);
  header_->num_tables.store(gen + 1, std::memory_order_release);
}

Status CacheState::GrowIndex(uint32_t seen, MemoryAccount* account) {
  Growth g;
  bool needed = false;
  Status s = BeginGrowth(seen, account, &g, &needed);
  if (!s.ok() || !needed) return s;
  ShmFile f;
  uint32_t tag = 0;
  std::string skipped;
  Status made = MakeTable(paths_, cache_id_, g, &f, &tag, &skipped);
  if (!skipped.empty() && log_) log_->Warn("cache {}: skipped {}", cache_id_, skipped);
  s = FinishGrowth(&g, made, std::move(f), tag, account);
  FreeCompacted(&g);
  EndGrowth(&g, account);
  return s;
}

Status CacheState::BeginGrowth(uint32_t seen, MemoryAccount* account, Growth* g,
                               bool* needed) {
  *needed = false;
  if (destroyed_) return Status::NotFound("cache was destroyed");
  const uint32_t n = header_->num_tables.load();
  if (seen != n) return Status::OK();  // somebody grew it already
  if (n >= layout::kMaxTables) {
    alloc_.MarkFull("the index reached its largest size");
    return Status::Full("the cache index reached its largest size");
  }
  const uint64_t prev = header_->tables[n - 1].capacity.load();
  g->gen = n;
  g->log2 = static_cast<uint32_t>(std::bit_width(prev));
  g->bytes = layout::TableFileSize(prev * 2);
  if (!account->Reserve(g->bytes)) return GrowthFailed(*g, IndexCapUsedUp(), account);
  *needed = true;
  ++growing_;
  return Status::OK();
}

Status CacheState::FinishGrowth(Growth* g, const Status& made, ShmFile file, uint32_t tag,
                                MemoryAccount* account) {
  // Another table of this generation was added meanwhile (a GrowIndex in
  // one call; the store keeps the spill path's out of a growth in steps):
  // this one is not needed.
  const bool wanted =
      !destroyed_ && header_ != nullptr && header_->num_tables.load() == g->gen;
  if (!made.ok() || !wanted) {
    if (made.ok()) {
      file.Unmap();
      ShmFile::Unlink(paths_.TableFile(cache_id_, g->gen, tag)).PermitUncheckedError();
    }
    account->Release(g->bytes);
    g->finished = true;
    return made.ok() ? Status::OK() : GrowthFailed(*g, made, account);
  }
  InstallTable(g->gen, std::move(file), tag);
  AddReserved(g->bytes);
  g->finished = true;
  CompactIndex(g);
  return Status::OK();
}

Status CacheState::IndexCapUsedUp() const {
  return Status::FullServerCap(
      fmt::format("cannot grow the index of cache {}: the server's memory cap is used up",
                  cache_id_));
}

Status CacheState::GrowthFailed(const Growth& g, const Status& why,
                                MemoryAccount* account) {
  if (why.IsFull()) {
    alloc_.MarkFull(why.message());
    // Full also reports a full shm dir; only the cap's shortage may pass.
    if (account->available() < g.bytes) alloc_.MarkByCap(layout::kStateFull);
  }
  return why;
}

void CacheState::CompactIndex(Growth* g) {
  // The newest table holds about as many rows as all tables before it
  // (each older one was copied into the next), and is twice the largest:
  // the copy fills it to 3/8, under its limit of 3/4.
  const uint32_t newest = static_cast<uint32_t>(index_.size()) - 1;
  const uint32_t first = header_->first_table.load(std::memory_order_relaxed);
  // Its room before the copy: thrown here, the older tables stay probed.
  g->to_free.reserve(newest);
  // InstallTable stored the count of tables; this fence orders that store
  // before the copy's loads of the older slots, as TableSet::Publish's
  // fence orders a writer's slot store before its load of the count. A
  // writer that published in an older table either has its row seen by
  // the copy below or sees the newer table and publishes there too.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (uint32_t t = first; t < newest; ++t) {
    if (!index_[t].CopyInto(&index_[newest])) {
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
  for (uint32_t t = 0; t < newest; ++t) {
    g->to_free.emplace_back(tables_[t].data(), tables_[t].size());
  }
  for (uint32_t t = first; t < newest; ++t) g->freed += tables_[t].size() - TableBytes(t);
}

void CacheState::FreeCompacted(Growth* g) {
  for (std::span<char> table : g->to_free) {
    const int e = FreeSlots(table);
    if (g->free_errno == 0) g->free_errno = e;
  }
}

void CacheState::EndGrowth(Growth* g, MemoryAccount* account) {
  // Released once freed: until then the pages were still held.
  file_bytes_ -= g->freed;
  account->Release(g->freed);
  PublishReserved();
  --growing_;
  g->ended = true;
  if (g->free_errno != 0 && log_) {
    log_->Warn("{}: could not free older index tables' slots: errno {}", Label(),
               g->free_errno);
  }
}

void CacheState::FreeTableSlots(uint32_t g) {
  const int e = FreeSlots(std::span(tables_[g].data(), tables_[g].size()));
  if (e != 0 && log_) {
    log_->Warn("{}: could not free index table {}'s slots: errno {}", Label(), g, e);
  }
}

int CacheState::FreeSlots(std::span<char> table) {
  // The pages past the first go back to the system (a reader still probing
  // the table reads zeros, empty slots: a miss, then the full path finds the
  // row in the newest), and the first page's slots are emptied so that no
  // stale location is left there. The header (the first page) stays, for
  // the daemon that adopts the file.
  const size_t page = 4096;
  int err = 0;
  if (table.size() > page &&
      madvise(table.data() + page, table.size() - page, MADV_REMOVE) != 0) {
    err = errno;
  }
  auto* slots = layout::TableSlots(reinterpret_cast<layout::TableHeader*>(table.data()));
  const size_t in_first_page =
      (std::min(table.size(), page) - sizeof(layout::TableHeader)) / sizeof(layout::Slot);
  for (size_t i = 0; i < in_first_page; ++i) {
    slots[i].loc.store(layout::kEmpty, std::memory_order_release);
  }
  return err;
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
