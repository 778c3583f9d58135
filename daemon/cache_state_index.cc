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

namespace shmcache {

namespace {
// Names tried before giving up when another user took them: random table
// tags collide by chance only.
constexpr uint32_t kTableNameTries = 8;
}  // namespace

namespace {
// Creates table file `gen` of 2^log2 slots under a fresh random tag, its
// pages reserved and cleared, and formats its header.
Status MakeTableFile(const InstancePaths& paths, uint32_t cache_id, uint32_t gen,
                     uint32_t log2, ShmFile* f, uint32_t* tag, std::string* skipped) {
  const size_t bytes = layout::TableFileSize(1ULL << log2);
  // A random tag in the name: whoever watches the shm dir cannot take the
  // name of this cache's next table ahead of it.
  std::random_device random;
  auto name = [&](uint32_t) {
    *tag = random();
    return paths.TableFile(cache_id, gen, *tag);
  };
  uint32_t chosen;
  Status s = ShmFile::CreateFresh(name, kTableNameTries, bytes, -1, f, &chosen, skipped);
  if (!s.ok()) return s;
  IndexTable::Format(reinterpret_cast<layout::TableHeader*>(f->data()), bytes, cache_id,
                     gen, log2);
  return Status::OK();
}
}  // namespace

Status CacheState::CreateTable(uint32_t gen, uint32_t log2, MemoryAccount* account) {
  const size_t bytes = layout::TableFileSize(1ULL << log2);
  if (!account->Reserve(bytes)) {
    return Status::FullServerCap(fmt::format(
        "cannot grow the index of cache {}: the server's memory cap is used up",
        cache_id_));
  }
  ShmFile f;
  uint32_t tag = 0;
  std::string skipped;
  Status s = MakeTableFile(paths_, cache_id_, gen, log2, &f, &tag, &skipped);
  if (!skipped.empty() && log_) log_->Warn("cache {}: skipped {}", cache_id_, skipped);
  if (!s.ok()) {
    account->Release(bytes);
    return s;
  }
  AddReserved(bytes);
  InstallTable(gen, std::move(f), tag);
  return Status::OK();
}

void CacheState::InstallTable(uint32_t gen, ShmFile f, uint32_t tag) {
  index_.emplace_back(reinterpret_cast<layout::TableHeader*>(f.data()));
  const uint64_t cap = index_.back().capacity();
  tables_.push_back(std::move(f));
  header_->tables[gen].tag = tag;
  header_->tables[gen].capacity.store(cap, std::memory_order_release);
  header_->num_tables.store(gen + 1, std::memory_order_release);
}

std::optional<SegmentJob> CacheState::TakeTableJob(MemoryAccount* account) {
  if (destroyed_ || header_ == nullptr || ahead_bytes_ != 0 || index_.empty()) {
    return std::nullopt;
  }
  const auto n = static_cast<uint32_t>(index_.size());
  const IndexTable& newest = index_.back();
  if (n >= layout::kMaxTables || newest.claimed() < newest.capacity() / 2) {
    return std::nullopt;
  }
  const auto log2 = static_cast<uint32_t>(std::bit_width(newest.capacity()));
  const uint64_t bytes = layout::TableFileSize(1ULL << log2);
  // Counted from now on, as a segment made ahead is: the cap holds while
  // the file is made, and the growth that takes it reserves nothing more.
  if (!account->Reserve(bytes)) return std::nullopt;
  ahead_bytes_ = bytes;
  ahead_gen_ = n;
  AddReserved(bytes);
  return SegmentJob{.cache_id = cache_id_,
                    .seg_no = n,
                    .node = -1,
                    .size = bytes,
                    .create = true,
                    .supply_from = 0,
                    .supply_to = 0,
                    .table_log2 = log2};
}

Status CacheState::RunTableJob(const InstancePaths& paths, const SegmentJob& job,
                               ShmFile* file, uint32_t* tag, std::string* skipped) {
  Status s =
      MakeTableFile(paths, job.cache_id, job.seg_no, job.table_log2, file, tag, skipped);
#ifdef MADV_POPULATE_WRITE
  // Its pages mapped in this process now, so that the growth's copy faults
  // none in under the lock (a first fault costs a page clear on tmpfs).
  // Where the kernel lacks it (before 5.14) the copy faults them as before.
  if (s.ok()) madvise(file->data(), file->size(), MADV_POPULATE_WRITE);
#endif
  return s;
}

void CacheState::FinishTableJob(const SegmentJob& job, const Status& made, ShmFile file,
                                uint32_t tag, MemoryAccount* account) {
  // Still wanted unless the growth made its own table under the lock
  // meanwhile (it released this job's reservation) or the cache was
  // destroyed (Destroy released it).
  const bool wanted =
      !destroyed_ && ahead_bytes_ != 0 && ahead_gen_ == job.seg_no && !ahead_.mapped();
  if (made.ok() && wanted) {
    ahead_ = std::move(file);
    ahead_tag_ = tag;
    return;
  }
  if (made.ok()) {
    file.Unmap();
    ShmFile::Unlink(paths_.TableFile(cache_id_, job.seg_no, tag)).PermitUncheckedError();
    return;
  }
  if (log_) {
    log_->Warn("{}: making the next index table ahead failed: {}", Label(),
               made.message());
  }
  if (wanted) ReleaseAhead(account);
}

void CacheState::DropAheadTable(MemoryAccount* account) {
  if (ahead_.mapped()) {
    ahead_.Unmap();
    ShmFile::Unlink(paths_.TableFile(cache_id_, ahead_gen_, ahead_tag_))
        .PermitUncheckedError();
  }
  if (account != nullptr) {
    ReleaseAhead(account);
  } else {
    ahead_bytes_ = 0;
  }
}

void CacheState::ReleaseAhead(MemoryAccount* account) {
  account->Release(ahead_bytes_);
  file_bytes_ -= ahead_bytes_;
  ahead_bytes_ = 0;
  PublishReserved();
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
  Status s;
  const bool made_ahead = ahead_.mapped() && ahead_gen_ == n;
  if (made_ahead) {
    // Made ahead (TakeTableJob), its bytes counted since: published at
    // once, so that under the lock only the copy is left.
    ahead_bytes_ = 0;
    InstallTable(n, std::move(ahead_), ahead_tag_);
  } else {
    // A job still making it is given up (FinishTableJob removes its file):
    // its bytes go back first, for this table.
    if (ahead_bytes_ != 0) DropAheadTable(account);
    s = CreateTable(n, static_cast<uint32_t>(std::bit_width(prev)), account);
  }
  if (s.ok()) {
    if (log_) {
      log_->Info("{}: index table {} of {} slots added ({})", Label(), n, prev * 2,
                 made_ahead ? "made ahead" : "made under the lock");
    }
    CompactIndex(account);
  }
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
