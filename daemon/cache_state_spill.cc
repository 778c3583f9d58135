// Spilling: whether this cache sends rows to disk, and the index entries
// of rows that are there.
#include "daemon/cache_state.h"

#include <algorithm>

#include "daemon/logger.h"
#include "format/cache_stats.h"
#include "format/index_table.h"

namespace shmcache {

bool CacheState::spilling_on() const {
  return header_ && layout::SpillingOn(header_->state.load());
}

void CacheState::StopSpilling(const std::string& why) {
  if (header_ == nullptr) return;
  spill_stopped_ = true;
  uint32_t old = header_->state.fetch_and(~layout::kStateSpillEnabled);
  if (old & layout::kStateMemFull) alloc_.MarkFull("spilling stopped: " + why);
}

bool CacheState::spill_enabled() const {
  return header_ && (header_->state.load() & layout::kStateSpillEnabled);
}

bool CacheState::RequestSpilling() {
  if (header_ == nullptr || spill_stopped_ || spill_enabled()) return false;
  const std::string why =
      "spilling asked for by a later open; rows past memory go to disk";
  // Before spilling is on: a cache whose spilling stopped in an earlier
  // server's life (full, with kStateMemFull) takes rows again as well
  // (TakeRowsAgain leaves a spilling cache whose memory is used up alone).
  // Clients set no state bits, and the store's lock is held: nobody sees
  // the step between.
  const bool resumed = alloc_.TakeRowsAgain(why);
  header_->state.fetch_or(layout::kStateSpillEnabled);
  if (!resumed && log_) log_->Info("{}: {}", Label(), why);
  return true;
}

uint64_t CacheState::DropSpilledRows() {
  if (header_ == nullptr) return 0;
  // Rows spill only once memory is used up (kStateMemFull), and each is
  // counted on disk: without either, no slot needs looking at. Not the
  // flag alone: a cache the server's cap made spill takes rows in memory
  // again once the cap frees up (ResumeIfCapAllows clears it), its rows
  // on disk still in the index.
  const uint64_t on_disk = ReadCacheStats(*header_, /*single_node=*/true).disk_rows;
  if (on_disk == 0 && !(header_->state.load() & layout::kStateMemFull)) return 0;
  uint64_t dropped = 0;
  for (IndexTable& t : LiveIndex()) dropped += t.RetireSpilled();
  for (layout::StatsSlot& slot : header_->stats) {
    slot.disk_rows.store(0, std::memory_order_relaxed);
    slot.disk_bytes.store(0, std::memory_order_relaxed);
  }
  return dropped;
}

bool CacheState::DropSpilledRow(uint64_t row_id, uint64_t bytes) {
  if (header_ == nullptr || destroyed_) return false;
  bool dropped = false;
  for (IndexTable& t : LiveIndex()) dropped = t.RetireSpilledKey(row_id) || dropped;
  if (!dropped) return false;
  layout::StatsSlot& daemon = header_->stats[0];
  const uint64_t rows = daemon.disk_rows.load(std::memory_order_relaxed);
  const uint64_t disk = daemon.disk_bytes.load(std::memory_order_relaxed);
  if (rows == 0) return true;
  if (bytes == 0) bytes = disk / rows;  // unreadable: as much as the mean row
  daemon.disk_rows.store(rows - 1, std::memory_order_relaxed);
  daemon.disk_bytes.store(disk - std::min(bytes, disk), std::memory_order_relaxed);
  return true;
}

Status CacheState::PublishSpilled(uint64_t row_id, uint64_t bytes, MemoryAccount* account,
                                  bool* inserted) {
  *inserted = false;
  if (destroyed_) return Status::NotFound("cache was destroyed");
  for (const IndexTable& t : LiveIndex()) {
    if (t.Find(row_id) != layout::kEmpty) return Status::OK();
  }
  for (;;) {
    switch (index_.back().Insert(row_id, layout::kSpilledBit)) {
      case IndexTable::InsertResult::kInserted:
        header_->stats[0].disk_rows.fetch_add(1, std::memory_order_relaxed);
        header_->stats[0].disk_bytes.fetch_add(bytes, std::memory_order_relaxed);
        *inserted = true;
        return Status::OK();
      case IndexTable::InsertResult::kExists: return Status::OK();
      case IndexTable::InsertResult::kTableFull: {
        Status s = GrowIndex(static_cast<uint32_t>(index_.size()), account);
        if (!s.ok()) return s;
      }
    }
  }
}

}  // namespace shmcache
