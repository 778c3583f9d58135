#include "lib/table_set.h"

#include <string>
#include <utility>

namespace shmcache {

TableSet::TableSet(const layout::CacheHeader* header, uint32_t cache_id,
                   std::function<InstancePaths()> paths)
    : header_(header), cache_id_(cache_id), paths_(std::move(paths)) {}

Status TableSet::MapNew() {
  ForkSafeLock lock(&mu_);
  const uint32_t have = num_tables_.load(std::memory_order_relaxed);
  const uint32_t want = header_->num_tables.load(std::memory_order_acquire);
  if (want > layout::kMaxTables) return Status::Corruption("too many index tables");
  if (have == want) return Status::OK();
  const InstancePaths paths = paths_();
  for (uint32_t g = have; g < want; ++g) {
    const uint64_t cap = header_->tables[g].capacity.load(std::memory_order_acquire);
    std::string path = paths.TableFile(cache_id_, g, header_->tables[g].tag);
    ShmFile f;
    Status s = ShmFile::Open(path, &f);
    if (!s.ok()) return s;
    if (const char* bad = layout::CheckTableFile(f.data(), f.size(), cap, g)) {
      return Status::Corruption(path + ": " + bad);
    }
    tables_[g] = IndexTable(reinterpret_cast<layout::TableHeader*>(f.data()));
    files_[g] = std::move(f);
    num_tables_.store(g + 1, std::memory_order_release);
  }
  const uint32_t first = header_->first_table.load(std::memory_order_acquire);
  Refresh({first < want ? first : want - 1, want});
  return Status::OK();
}

TableSet::Published TableSet::Publish(uint64_t id, uint64_t loc, uint32_t* tables) {
  switch (InsertNewest(id, loc, tables)) {
    case IndexTable::InsertResult::kInserted: return Follow(id, loc, tables);
    case IndexTable::InsertResult::kExists: return Published::kExists;
    case IndexTable::InsertResult::kTableFull: return Published::kTableFull;
  }
  return Published::kTableFull;  // not reached
}

TableSet::Published TableSet::Republish(uint64_t id, uint64_t loc, uint32_t* tables) {
  // No table past those seen is mapped: the newest mapped one holds the row
  // already, or is the full one.
  if (Mapped() <= *tables) return Published::kBehind;
  switch (Publish(id, loc, tables)) {
    // The row is published already (behind): the id in the newest table,
    // put there by the copy or by another writer, who follows it on, is
    // what lookups find.
    case Published::kInserted:
    case Published::kExists: return Published::kInserted;
    case Published::kTableFull:
    case Published::kBehind: return Published::kBehind;
  }
  return Published::kBehind;  // not reached
}

TableSet::Published TableSet::Follow(uint64_t id, uint64_t loc, uint32_t* tables) {
  // The row's slot is stored; the fence orders that store before the load
  // of the table count, as the daemon's fence orders its store of the count
  // before its copy reads the slots: either the copy sees this row or this
  // load sees the newer table (CacheState::CompactIndex).
  for (;;) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t was = *tables;
    if (header_->num_tables.load(std::memory_order_relaxed) <= was) {
      return Published::kInserted;
    }
    if (Mapped() <= was) return Published::kBehind;  // cannot be mapped
    // kExists: the copy (or another writer, who follows it on) put the key
    // there. kTableFull: the copy may have passed the row's slot, and
    // lookups from first_table on would not find it: the caller grows the
    // index and publishes it in the new table (Republish).
    switch (InsertNewest(id, loc, tables)) {
      case IndexTable::InsertResult::kInserted: break;
      case IndexTable::InsertResult::kExists: return Published::kInserted;
      case IndexTable::InsertResult::kTableFull: return Published::kBehind;
    }
  }
}

uint32_t TableSet::MapForLookup() {
  MapNew().PermitUncheckedError();
  return num_tables_.load(std::memory_order_acquire);
}

}  // namespace shmcache
