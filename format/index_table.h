// IndexTable: lock-free operations on one mapped index table (layout.h).
//
// Any number of processes may Find and Insert concurrently. No operation
// waits for another: a writer killed between claiming a slot and publishing
// it leaves one dead slot (skipped by everyone), never a stuck reader.
//
// Duplicates: Insert probes for the key; if it is published, the new row is
// dropped. A writer meeting a slot another writer has claimed but not yet
// published waits (bounded: a few thousand spins and yields) to see its key,
// so two writers of one id do not both store it. Only a claimer that stalls
// past that bound (killed, or descheduled for long) can lead to a second
// copy; readers then see one of two whole, equal-id rows.
//
// Retiring: the daemon may withdraw rows it can no longer serve (spilled
// rows whose database is gone) while clients use the table. A retired slot
// reads as a miss and keeps its key; an Insert of that key takes the slot
// again (every writer of the key meets that slot first on its probe, so
// they race for it with one CAS and only one wins).
#pragma once

#include <cstdint>

#include "format/layout.h"

namespace shmcache {

class IndexTable {
 public:
  explicit IndexTable(layout::TableHeader* header = nullptr)
      : header_(header),
        slots_(header ? layout::TableSlots(header) : nullptr),
        mask_(header ? header->capacity - 1 : 0),
        shift_(header ? 64 - header->capacity_log2 : 0) {}

  enum class InsertResult { kInserted, kExists, kTableFull };

  // Initialises a freshly created, zeroed table file.
  static void Format(layout::TableHeader* header, size_t file_size, uint32_t cache_id,
                     uint32_t generation, uint32_t capacity_log2);

  // The published location of `key`, or kEmpty.
  uint64_t Find(uint64_t key) const { return FindFrom(key, Home(key)); }
  // Find, its probe starting at i = Home(key), which the caller computed.
  uint64_t FindFrom(uint64_t key, uint64_t i) const {
    for (uint64_t probes = 0; probes <= mask_; ++probes, i = (i + 1) & mask_) {
      const layout::Slot& s = slots_[i];
      uint64_t loc = s.loc.load(std::memory_order_acquire);
      if (loc == layout::kEmpty) return layout::kEmpty;
      if (loc != layout::kClaimed && loc != layout::kRetired &&
          s.key.load(std::memory_order_relaxed) == key) {
        return loc;
      }
    }
    return layout::kEmpty;
  }

  // Starts loading the slot where a probe for `key` begins.
  [[gnu::always_inline]] void Prefetch(uint64_t key) const { PrefetchSlot(Home(key)); }
  // The slot where a probe for `key` begins, and its prefetch.
  uint64_t Home(uint64_t key) const {
    return (key * 0x9E3779B97F4A7C15ULL) >> shift_ & mask_;
  }
  // Always inlined: gcc 12 finds a function whose only statement is a
  // prefetch "looping pure" and drops a call of it that it did not inline
  // early, with the prefetch (it did so in TableSet::LookupIn: the
  // single-row lookup over several tables prefetched nothing).
  [[gnu::always_inline]] void PrefetchSlot(uint64_t i) const {
    __builtin_prefetch(&slots_[i]);
  }

  // Publishes key -> loc. kTableFull when the table passed its load limit
  // (the caller grows the index and retries in the next table).
  InsertResult Insert(uint64_t key, uint64_t loc);

  // Publishes every published slot of this table in `to` (a larger, newer
  // table), as Insert does: a key `to` already holds is left as it is.
  // Claimed and retired slots are skipped (a claimer that publishes later
  // checks for a newer table itself: TableSet::Publish). False when `to`
  // filled before the last slot was copied. Safe while others Find and
  // Insert in both tables.
  bool CopyInto(IndexTable* to) const;

  // Retires every slot holding a spilled location (layout::kSpilledBit);
  // returns how many. Safe while others Find and Insert.
  uint64_t RetireSpilled();
  // Retires the slot of `key` when it holds a spilled location (its row
  // failed its check on disk); false when it holds none. Safe as
  // RetireSpilled is.
  bool RetireSpilledKey(uint64_t key);

  uint64_t capacity() const { return mask_ + 1; }
  uint64_t claimed() const { return header_->claimed.load(std::memory_order_relaxed); }
  // Claimed slots allowed before the table counts as full: 3/4.
  uint64_t limit() const { return capacity() - capacity() / 4; }
  bool valid() const { return header_ != nullptr; }

 private:
  // Waits for a claimed slot to be published; kClaimed if it never is.
  static uint64_t AwaitPublished(const layout::Slot& s);
  layout::TableHeader* header_;
  layout::Slot* slots_;
  uint64_t mask_;
  int shift_;
};

}  // namespace shmcache
