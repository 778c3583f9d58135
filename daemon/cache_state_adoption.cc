// Adopting a cache a previous daemon of this instance left in shared
// memory: its header, tables and segments, each checked before use.
#include "cache_state.h"

#include <fmt/format.h>

namespace shmcache {

Status CacheState::Adopt(const InstancePaths& paths, uint32_t cache_id,
                         const std::set<uint32_t>& seg_nos, int num_nodes,
                         MemoryAccount* account, Logger* log,
                         std::unique_ptr<CacheState>* out) {
  std::unique_ptr<CacheState> c(new CacheState(paths, cache_id, num_nodes, log));
  Status s = c->AdoptHeader();
  for (uint32_t g = 0; s.ok() && g < c->header_->num_tables.load(); ++g) {
    s = c->AdoptTable(g);
  }
  for (auto n = seg_nos.begin(); s.ok() && n != seg_nos.end(); ++n) {
    s = c->AdoptSegment(*n);
  }
  if (!s.ok()) return s;
  if (!account->Reserve(c->reserved_bytes_)) {
    return Status::FullServerCap(fmt::format(
        "it holds {} MB (session {}, '{}'), more than is left under the memory "
        "cap of {} MB",
        c->reserved_bytes_ >> 20, c->session_id_, c->name_, account->cap >> 20));
  }
  c->header_->reserved_bytes.store(c->reserved_bytes_);
  *out = std::move(c);
  return Status::OK();
}

bool CacheState::UsesTable(uint32_t gen, uint32_t tag) const {
  return header_ != nullptr && gen < tables_.size() && header_->tables[gen].tag == tag;
}

std::string CacheState::TablePath(uint32_t gen) const {
  return paths_.TableFile(cache_id_, gen, header_->tables[gen].tag);
}

Status CacheState::AdoptHeader() {
  std::string path = paths_.CacheFile(cache_id_);
  Status s = ShmFile::Open(path, &header_file_);
  if (!s.ok()) return s;
  if (const char* bad =
          layout::CheckFileHeader(header_file_.data(), header_file_.size(),
                                  layout::kCacheMagic, sizeof(layout::CacheHeader))) {
    return Status::Corruption(path + ": " + bad);
  }
  auto* h = reinterpret_cast<layout::CacheHeader*>(header_file_.data());
  if (h->cache_id != cache_id_ || h->num_tables.load() == 0 ||
      h->num_tables.load() > layout::kMaxTables) {
    return Status::Corruption(path + ": header fields out of range");
  }
  header_ = h;
  session_id_ = h->session_id;
  name_.assign(h->name, h->name_len);
  fingerprint_.assign(h->fingerprint, h->fingerprint_len);
  budget_bytes_ = h->budget_bytes;
  reserved_bytes_ = header_file_.size();
  return Status::OK();
}

Status CacheState::AdoptTable(uint32_t gen) {
  std::string path = TablePath(gen);
  ShmFile f;
  Status s = ShmFile::Open(path, &f);
  if (!s.ok()) return s;
  if (const char* bad = layout::CheckTableFile(
          f.data(), f.size(), header_->tables[gen].capacity.load(), gen)) {
    return Status::Corruption(path + ": " + bad);
  }
  reserved_bytes_ += f.size();
  index_.emplace_back(reinterpret_cast<layout::TableHeader*>(f.data()));
  tables_.push_back(std::move(f));
  return Status::OK();
}

Status CacheState::AdoptSegment(uint32_t seg_no) {
  std::string path = paths_.SegmentFile(cache_id_, seg_no);
  ShmFile f;
  Status s = ShmFile::Open(path, &f);
  if (!s.ok()) return s;
  if (f.size() >= sizeof(layout::FileHeader) &&
      reinterpret_cast<layout::FileHeader*>(f.data())->magic == 0) {
    // Being prepared when the daemon died; nothing points into it.
    f.Unmap();
    ShmFile::Unlink(path).PermitUncheckedError();
    return Status::OK();
  }
  if (const char* bad = layout::CheckSegmentFile(f.data(), f.size(), cache_id_, seg_no)) {
    return Status::Corruption(path + ": " + bad);
  }
  auto* sh = reinterpret_cast<layout::SegmentHeader*>(f.data());
  uint64_t carved = sh->carved.load();
  // Chunks start on cache lines (their headers hold atomics): a carved mark
  // off one would put the next chunk's header astride two.
  if (sh->node >= static_cast<uint32_t>(num_nodes_) ||
      carved < layout::kSegmentHeaderSize || carved > f.size() ||
      carved % layout::kCacheLine != 0) {
    return Status::Corruption(path + ": segment header fields out of range");
  }
  // Chunks leased by the previous daemon stay with whoever holds them;
  // only the space never carved is handed out again.
  uint64_t size = f.size();
  data_bytes_ += size;
  reserved_bytes_ += size;
  int node = static_cast<int>(sh->node);
  segments_.emplace(seg_no, Segment{seg_no, node, size, carved, std::move(f)});
  current_[static_cast<size_t>(node)] = static_cast<int>(seg_no);
  next_seg_no_ = seg_no + 1;
  return Status::OK();
}

}  // namespace shmcache
