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

IndexTable::InsertResult TableSet::Publish(uint64_t id, uint64_t loc, uint32_t* tables) {
  const IndexTable::InsertResult r = InsertNewest(id, loc, tables);
  // kExists: the writer that published the key answers for it.
  if (r != IndexTable::InsertResult::kInserted) return r;
  // The row's slot is stored; the fence orders that store before the load
  // of the table count, as the daemon's fence orders its store of the count
  // before its copy reads the slots: either the copy sees this row or this
  // load sees the newer table (CacheState::CompactIndex).
  for (uint32_t was = *tables;;) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (header_->num_tables.load(std::memory_order_relaxed) <= was) return r;
    if (Mapped() <= was) return r;  // the newer table cannot be mapped
    // kExists: the copy (or another writer) put the key there. kTableFull:
    // the row stays where it is published (a lookup from first_table on may
    // miss it; it never reads a wrong row), and its space stays the row's.
    uint32_t now = 0;
    if (InsertNewest(id, loc, &now) != IndexTable::InsertResult::kInserted) return r;
    was = now;
  }
}

uint32_t TableSet::MapForLookup() {
  MapNew().PermitUncheckedError();
  return num_tables_.load(std::memory_order_acquire);
}

}  // namespace shmcache
