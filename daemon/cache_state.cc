#include "cache_state.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "cache_stats.h"
#include "logger.h"

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
      prepared_(static_cast<size_t>(num_nodes)),
      preparing_(static_cast<size_t>(num_nodes), false),
      current_(static_cast<size_t>(num_nodes), -1),
      tails_(static_cast<size_t>(num_nodes)) {}

CacheState::~CacheState() = default;

Status CacheState::Create(const InstancePaths& paths, uint32_t cache_id,
                          uint32_t session_id, const std::string& name,
                          const std::string& fingerprint, uint64_t budget_bytes,
                          bool spilling, int num_nodes, MemoryAccount* account,
                          Logger* log, std::unique_ptr<CacheState>* out) {
  std::unique_ptr<CacheState> c(new CacheState(paths, cache_id, num_nodes, log));
  c->session_id_ = session_id;
  c->name_ = name;
  c->fingerprint_ = fingerprint;
  c->budget_bytes_ = budget_bytes;

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
  h->budget_bytes = budget_bytes;
  h->name_len = static_cast<uint8_t>(name.size());
  std::memcpy(h->name, name.data(), name.size());
  h->fingerprint_len = static_cast<uint8_t>(fingerprint.size());
  std::memcpy(h->fingerprint, fingerprint.data(), fingerprint.size());
  h->state.store(spilling ? layout::kStateSpilling : 0);
  h->reserved_bytes.store(header_bytes);
  c->header_ = h;

  // Size the first table for rows of about 4 KB filling the budget; later
  // tables double.
  uint64_t rows = budget_bytes / 4096 * 4 / 3 + 1;
  uint32_t log2 = std::clamp<uint32_t>(static_cast<uint32_t>(std::bit_width(rows)),
                                       kMinTableLog2, kMaxInitialTableLog2);
  s = c->CreateTable(0, log2, account);
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
  reserved_bytes_ += n;
  if (header_) header_->reserved_bytes.store(reserved_bytes_);
}

void CacheState::MarkFull(const std::string& why) {
  uint32_t old = header_->state.fetch_or(layout::kStateFull);
  if (!(old & layout::kStateFull) && log_) {
    log_->Warn("{} is full: {}; further rows are not cached", Label(), why);
  }
}

uint64_t CacheState::UnlinkFile(const std::string& path, uint64_t bytes,
                                std::vector<HeldFile>* held) {
  HeldFile f;
  uint64_t size = 0;
  bool known = held != nullptr && StatFile(path, &f.id, &size);
  ShmFile::Unlink(path).PermitUncheckedError();
  if (!known) return 0;
  f.bytes = std::min(bytes, size);
  held->push_back(f);
  return f.bytes;
}

void CacheState::Destroy(MemoryAccount* account, std::vector<HeldFile>* held) {
  if (destroyed_) return;
  destroyed_ = true;
  if (header_) header_->state.fetch_or(layout::kStateDestroyed);
  uint64_t kept = 0;
  for (const auto& [seg_no, seg] : segments_) {
    kept += UnlinkFile(paths_.SegmentFile(cache_id_, seg_no), seg.size, held);
  }
  for (auto& p : prepared_) {
    if (p) kept += UnlinkFile(paths_.SegmentFile(cache_id_, p->seg_no), p->size, held);
    p.reset();
  }
  for (size_t g = 0; g < tables_.size(); ++g) {
    kept += UnlinkFile(TablePath(static_cast<uint32_t>(g)), tables_[g].size(), held);
  }
  kept += UnlinkFile(paths_.CacheFile(cache_id_), header_file_.size(), held);
  segments_.clear();
  index_.clear();
  tables_.clear();
  header_file_.Unmap();
  header_ = nullptr;
  // Reserved without a file (a segment job never run) is free at once.
  account->Release(reserved_bytes_ - std::min(kept, reserved_bytes_));
  reserved_bytes_ = 0;
  leases_.clear();
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
  out.reserved_bytes = reserved_bytes_;
  out.budget_bytes = budget_bytes_;
  return out;
}

}  // namespace shmcache
