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
  return Status::OK();
}

uint32_t TableSet::MapForLookup() {
  MapNew().PermitUncheckedError();
  return num_tables_.load(std::memory_order_acquire);
}

}  // namespace shmcache
