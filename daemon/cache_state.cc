#include "daemon/cache_state.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "daemon/logger.h"
#include "format/align.h"
#include "format/cache_stats.h"

namespace shmcache {

namespace {
constexpr uint32_t kMinTableLog2 = 12;
constexpr uint32_t kMaxInitialTableLog2 = 18;
}  // namespace

CacheState::CacheState(const InstancePaths& paths, uint32_t cache_id, int num_nodes,
                       Logger* log)
    : paths_(paths),
      log_(log),
      cache_id_(cache_id),
      num_nodes_(num_nodes),
      alloc_(paths, cache_id, num_nodes, log) {}

CacheState::~CacheState() = default;

Status CacheState::Create(const InstancePaths& paths, uint32_t cache_id,
                          uint32_t session_id, const std::string& name,
                          const std::string& fingerprint, uint64_t budget_bytes,
                          bool spill_requested, int num_nodes, MemoryAccount* account,
                          Logger* log, std::unique_ptr<CacheState>* out,
                          const std::function<void()>& installing) {
  std::unique_ptr<CacheState> c(new CacheState(paths, cache_id, num_nodes, log));
  c->session_id_ = session_id;
  c->name_ = name;
  c->fingerprint_ = fingerprint;

  const uint64_t header_bytes = AlignUp(sizeof(layout::CacheHeader), 4096);
  if (!account->Reserve(header_bytes)) {
    return Status::FullServerCap("the server's memory cap is used up");
  }
  Status s =
      ShmFile::Create(paths.CacheFile(cache_id), header_bytes, -1, &c->header_file_);
  if (!s.ok()) {
    account->Release(header_bytes);
    return s;
  }
  c->AddReserved(header_bytes);
  auto* h = reinterpret_cast<layout::CacheHeader*>(c->header_file_.data());
  h->cache_id = cache_id;
  h->session_id = session_id;
  h->budget_bytes.store(budget_bytes);
  h->name_len = static_cast<uint8_t>(name.size());
  std::memcpy(h->name, name.data(), name.size());
  h->fingerprint_len = static_cast<uint8_t>(fingerprint.size());
  std::memcpy(h->fingerprint, fingerprint.data(), fingerprint.size());
  h->state.store(spill_requested ? layout::kStateSpillEnabled : 0);
  h->reserved_bytes.store(header_bytes);
  c->header_ = h;
  c->alloc_.Attach(h, c->Label(), budget_bytes);

  // Size the first table for rows of about 4 KB filling the budget; later
  // tables double.
  uint64_t rows = budget_bytes / 4096 * 4 / 3 + 1;
  uint32_t log2 = std::clamp<uint32_t>(static_cast<uint32_t>(std::bit_width(rows)),
                                       kMinTableLog2, kMaxInitialTableLog2);
  s = c->CreateTable(0, log2, account, installing);
  if (!s.ok()) {
    c->Destroy(account);
    return s;
  }
  // The header is published last: a client that maps it sees a usable cache.
  h->file.magic = layout::kCacheMagic;
  h->file.version = layout::kLayoutVersion;
  h->file.header_size = sizeof(layout::CacheHeader);
  h->file.file_size = header_bytes;
  *out = std::move(c);
  return Status::OK();
}

void CacheState::AddReserved(uint64_t n) {
  file_bytes_ += n;
  PublishReserved();
}

void CacheState::PublishReserved() {
  if (header_) header_->reserved_bytes.store(reserved_bytes());
}

void CacheState::Destroy(MemoryAccount* account, std::vector<HeldFile>* held) {
  if (destroyed_) return;
  destroyed_ = true;
  if (header_) header_->state.fetch_or(layout::kStateDestroyed);
  // Reserved without a file (a segment job never run) is free at once.
  const uint64_t reserved = reserved_bytes();
  uint64_t kept = alloc_.Release(held);
  for (size_t g = 0; g < tables_.size(); ++g) {
    const auto gen = static_cast<uint32_t>(g);
    kept += UnlinkHeldFile(TablePath(gen), TableBytes(gen), held);
  }
  kept += UnlinkHeldFile(paths_.CacheFile(cache_id_), header_file_.size(), held);
  index_.clear();
  tables_.clear();
  header_file_.Unmap();
  header_ = nullptr;
  account->Release(reserved - std::min(kept, reserved));
  file_bytes_ = 0;
}

Status CacheState::Lease(uint64_t conn, int node, uint64_t need, MemoryAccount* account,
                         ChunkLease* out, bool* wait) {
  Status s = alloc_.Lease(conn, node, need, account, out, wait);
  PublishReserved();
  return s;
}

void CacheState::Return(uint64_t conn, uint32_t seg_no, uint64_t offset) {
  alloc_.Return(conn, seg_no, offset);
}

void CacheState::ReleaseConnection(uint64_t conn, bool recycle) {
  alloc_.ReleaseConnection(conn, recycle);
}

bool CacheState::ResumeIfCapAllows(const MemoryAccount& account) {
  return alloc_.ResumeIfCapAllows(account);
}

bool CacheState::RaiseBudget(uint64_t bytes) { return alloc_.RaiseBudget(bytes); }

std::vector<SegmentJob> CacheState::TakeSegmentJobs(int node, MemoryAccount* account,
                                                    int max_jobs) {
  std::vector<SegmentJob> jobs = alloc_.TakeSegmentJobs(node, account, max_jobs);
  if (!jobs.empty()) PublishReserved();
  return jobs;
}

void CacheState::FinishSegmentJob(const SegmentJob& job, const Status& made, ShmFile file,
                                  MemoryAccount* account,
                                  const std::function<void()>& keeping) {
  alloc_.FinishSegmentJob(job, made, std::move(file), account, keeping);
  PublishReserved();
}

// Adopting a cache a previous daemon of this instance left in shared
// memory: its header, tables and segments, each checked before use.
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
    s = c->alloc_.AdoptSegment(*n);
  }
  if (!s.ok()) return s;
  if (!account->Reserve(c->reserved_bytes())) {
    return Status::FullServerCap(fmt::format(
        "it holds {} MB (session {}, '{}'), more than is left under the memory "
        "cap of {} MB",
        c->reserved_bytes() >> 20, c->session_id_, c->name_, account->cap >> 20));
  }
  c->header_->reserved_bytes.store(c->reserved_bytes());
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
      h->num_tables.load() > layout::kMaxTables ||
      h->first_table.load() >= h->num_tables.load()) {
    return Status::Corruption(path + ": header fields out of range");
  }
  header_ = h;
  session_id_ = h->session_id;
  name_.assign(h->name, h->name_len);
  fingerprint_.assign(h->fingerprint, h->fingerprint_len);
  file_bytes_ = header_file_.size();
  alloc_.Attach(h, Label(), h->budget_bytes.load());
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
  index_.emplace_back(reinterpret_cast<layout::TableHeader*>(f.data()));
  tables_.push_back(std::move(f));
  file_bytes_ += TableBytes(gen);
  // Compacted away: its slots were freed, unless the daemon that compacted
  // was killed first; freed again, so that the one page TableBytes counts is
  // what the file holds.
  if (gen < header_->first_table.load(std::memory_order_relaxed)) FreeTableSlots(gen);
  return Status::OK();
}

std::string CacheState::Label() const {
  return fmt::format("cache {} (session {}, '{}')", cache_id_, session_id_, name_);
}

CacheStats CacheState::Stats() const {
  CacheStats out;
  if (header_ != nullptr) {
    out = ReadCacheStats(*header_, num_nodes_ == 1);
    out.spill_reads += spill_reads_;
    return out;
  }
  out.session_id = session_id_;  // destroyed: its header is gone
  out.cache_id = cache_id_;
  out.name = name_;
  out.reserved_bytes = reserved_bytes();
  out.budget_bytes = alloc_.budget_bytes();
  return out;
}

}  // namespace shmcache
