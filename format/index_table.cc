#include "format/index_table.h"

#include <sched.h>

namespace shmcache {

void IndexTable::Format(layout::TableHeader* h, size_t file_size, uint32_t cache_id,
                        uint32_t generation, uint32_t capacity_log2) {
  h->file.magic = layout::kTableMagic;
  h->file.version = layout::kLayoutVersion;
  h->file.header_size = sizeof(layout::TableHeader);
  h->file.file_size = file_size;
  h->cache_id = cache_id;
  h->generation = generation;
  h->capacity = 1ULL << capacity_log2;
  h->capacity_log2 = capacity_log2;
  h->claimed.store(0, std::memory_order_release);
}

uint64_t IndexTable::AwaitPublished(const layout::Slot& s) {
  // A claimed slot is published two stores later (the row was written
  // before the claim), so this returns at once unless the claimer was
  // preempted or killed. Waiting keeps two writers of one id from both
  // storing it; the bound keeps a dead writer from stalling anyone.
  for (int i = 0; i < 4096; ++i) {
    uint64_t loc = s.loc.load(std::memory_order_acquire);
    if (loc != layout::kClaimed) return loc;
    if (i < 64) {
      __builtin_ia32_pause();
    } else {
      sched_yield();
    }
  }
  return layout::kClaimed;
}

IndexTable::InsertResult IndexTable::Insert(uint64_t key, uint64_t loc) {
  uint64_t i = Home(key);
  for (uint64_t probes = 0; probes <= mask_; ++probes, i = (i + 1) & mask_) {
    layout::Slot& s = slots_[i];
    uint64_t cur = s.loc.load(std::memory_order_acquire);
    if (cur == layout::kEmpty) {
      // The load limit keeps probe chains short and leaves empty slots, so
      // that misses terminate early.
      if (header_->claimed.load(std::memory_order_relaxed) >= limit()) {
        return InsertResult::kTableFull;
      }
      if (s.loc.compare_exchange_strong(cur, layout::kClaimed,
                                        std::memory_order_acq_rel)) {
        header_->claimed.fetch_add(1, std::memory_order_relaxed);
        s.key.store(key, std::memory_order_relaxed);
        s.loc.store(loc, std::memory_order_release);  // commit point
        return InsertResult::kInserted;
      }
      // Lost the race for this slot: look at what the winner published.
    }
    if (cur == layout::kClaimed) cur = AwaitPublished(s);
    if (cur == layout::kClaimed) continue;  // its writer died: skip it
    if (s.key.load(std::memory_order_relaxed) != key) continue;
    // This key's retired row: publish the new one in its place. Losing the
    // CAS means another writer of the key published first.
    if (cur == layout::kRetired &&
        s.loc.compare_exchange_strong(cur, loc, std::memory_order_acq_rel)) {
      return InsertResult::kInserted;
    }
    return InsertResult::kExists;
  }
  return InsertResult::kTableFull;
}

bool IndexTable::CopyInto(IndexTable* to) const {
  for (uint64_t i = 0; i <= mask_; ++i) {
    const layout::Slot& s = slots_[i];
    const uint64_t loc = s.loc.load(std::memory_order_acquire);
    if (loc == layout::kEmpty || loc == layout::kClaimed || loc == layout::kRetired) {
      continue;
    }
    const uint64_t key = s.key.load(std::memory_order_relaxed);
    if (to->Insert(key, loc) == InsertResult::kTableFull) return false;
  }
  return true;
}

uint64_t IndexTable::RetireSpilled() {
  uint64_t retired = 0;
  for (uint64_t i = 0; i <= mask_; ++i) {
    uint64_t loc = slots_[i].loc.load(std::memory_order_acquire);
    if (!(loc & layout::kSpilledBit)) continue;
    if (slots_[i].loc.compare_exchange_strong(loc, layout::kRetired,
                                              std::memory_order_acq_rel)) {
      ++retired;
    }
  }
  return retired;
}

bool IndexTable::RetireSpilledKey(uint64_t key) {
  uint64_t i = Home(key);
  for (uint64_t probes = 0; probes <= mask_; ++probes, i = (i + 1) & mask_) {
    layout::Slot& s = slots_[i];
    uint64_t loc = s.loc.load(std::memory_order_acquire);
    if (loc == layout::kEmpty) return false;
    if (loc == layout::kClaimed || loc == layout::kRetired ||
        s.key.load(std::memory_order_relaxed) != key) {
      continue;
    }
    // The key's one published slot: a row in memory is not this call's.
    return (loc & layout::kSpilledBit) &&
           s.loc.compare_exchange_strong(loc, layout::kRetired,
                                         std::memory_order_acq_rel);
  }
  return false;
}

}  // namespace shmcache
