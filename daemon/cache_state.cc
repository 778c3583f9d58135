#include "cache_state.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fmt/format.h>
#include <random>

#include "cache_stats.h"
#include "index_table.h"
#include "logger.h"

namespace shmcache {

namespace {
uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }
double Megabytes(uint64_t n) { return static_cast<double>(n) / (1 << 20); }
constexpr uint32_t kMinTableLog2 = 12;
constexpr uint32_t kMaxInitialTableLog2 = 18;
// Names tried before giving up when another user took them: random table
// tags collide by chance only; segment numbers are skipped in order, and
// the next call goes on past them.
constexpr uint32_t kTableNameTries = 8;
constexpr uint32_t kSegmentNameTries = 1024;
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
    return Status::Full("the server's memory cap is used up");
  }
  Status s = ShmFile::Create(paths.CacheFile(cache_id), header_bytes, -1,
                             &c->header_file_);
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
  uint32_t log2 = std::clamp<uint32_t>(
      static_cast<uint32_t>(std::bit_width(rows)), kMinTableLog2,
      kMaxInitialTableLog2);
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

Status CacheState::CreateTable(uint32_t gen, uint32_t log2,
                               MemoryAccount* account) {
  uint64_t cap = 1ULL << log2;
  size_t bytes = layout::TableFileSize(cap);
  if (!account->Reserve(bytes)) {
    return Status::Full(fmt::format(
        "cannot grow the index of cache {}: the server's memory cap is used up",
        cache_id_));
  }
  // A random tag in the name: whoever watches the shm dir cannot take the
  // name of this cache's next table ahead of it.
  std::random_device random;
  uint32_t tag = 0;
  auto name = [&](uint32_t) {
    tag = random();
    return paths_.TableFile(cache_id_, gen, tag);
  };
  ShmFile f;
  uint32_t chosen;
  std::string skipped;
  Status s = ShmFile::CreateFresh(name, kTableNameTries, bytes, -1, &f, &chosen,
                                  &skipped);
  if (!skipped.empty() && log_) log_->Warn("cache {}: skipped {}", cache_id_, skipped);
  if (!s.ok()) {
    account->Release(bytes);
    return s;
  }
  auto* t = reinterpret_cast<layout::TableHeader*>(f.data());
  IndexTable::Format(t, bytes, cache_id_, gen, log2);
  index_.emplace_back(t);
  tables_.push_back(std::move(f));
  AddReserved(bytes);
  header_->tables[gen].tag = tag;
  header_->tables[gen].capacity.store(cap, std::memory_order_release);
  header_->num_tables.store(gen + 1, std::memory_order_release);
  return Status::OK();
}

Status CacheState::GrowIndex(uint32_t seen, MemoryAccount* account) {
  if (destroyed_) return Status::NotFound("cache was destroyed");
  uint32_t n = header_->num_tables.load();
  if (seen != n) return Status::OK();  // somebody grew it already
  if (n >= layout::kMaxTables) {
    MarkFull("the index reached its largest size");
    return Status::Full("the cache index reached its largest size");
  }
  uint64_t prev = header_->tables[n - 1].capacity.load();
  Status s = CreateTable(n, static_cast<uint32_t>(std::bit_width(prev)), account);
  if (s.IsFull()) {
    MarkFull(s.message());
    // Full also reports a full shm dir; only the cap's shortage may pass.
    if (account->available() < layout::TableFileSize(prev * 2)) {
      cap_full_bits_ |= layout::kStateFull;
    }
  }
  return s;
}

void CacheState::MarkFull(const std::string& why) {
  uint32_t old = header_->state.fetch_or(layout::kStateFull);
  if (!(old & layout::kStateFull) && log_) {
    log_->Warn("{} is full: {}; further rows are not cached", Label(), why);
  }
}

uint64_t CacheState::NextSegmentSize(uint64_t min_bytes,
                                     const MemoryAccount& account) const {
  // Grow by a quarter of what the cache holds: few segments for big caches,
  // and at most ~25% reserved but unused at the end.
  uint64_t want = std::clamp<uint64_t>(AlignUp(data_bytes_ / 4, 1 << 20),
                                       kMinSegmentBytes, kMaxSegmentBytes);
  want = std::max(want, min_bytes);
  // Whole 2 MB pages where possible, so that huge pages can back it.
  if (want >= (4u << 20)) want = AlignUp(want, 2u << 20);
  want = std::min({want, BudgetLeft(), account.available()});
  want = want / 4096 * 4096;
  return want >= min_bytes ? want : 0;
}

uint64_t CacheState::BudgetLeft() const {
  return budget_bytes_ > data_bytes_ ? budget_bytes_ - data_bytes_ : 0;
}

Status CacheState::NoRoomFor(uint64_t chunk_bytes, uint64_t min_bytes,
                             const MemoryAccount& account) {
  const uint64_t left = BudgetLeft();
  const uint64_t room = std::min(left, account.available());
  if (room >= kMinSegmentBytes) {
    // Room for ordinary rows is left: refusing them all for one big row
    // would waste it.
    std::string where =
        room < left ? fmt::format("{:.1f} MB are left under the server's memory cap "
                                  "of {} MB (the cache's budget is {} MB)",
                                  Megabytes(room), account.cap >> 20,
                                  budget_bytes_ >> 20)
                    : fmt::format("{:.1f} MB are left of its budget of {} MB",
                                  Megabytes(room), budget_bytes_ >> 20);
    return Status::TooLarge(fmt::format(
        "a row of {:.1f} MB does not fit in cache {}: {}; it is not cached, "
        "smaller rows still are",
        Megabytes(chunk_bytes - sizeof(layout::ChunkHeader)), cache_id_, where));
  }
  if (left < min_bytes) {
    return MemoryUsedUp(
        fmt::format("its budget of {} MB is used up", budget_bytes_ >> 20), false);
  }
  return MemoryUsedUp(fmt::format("the server's memory cap of {} MB is used up",
                                  account.cap >> 20),
                      true);
}

Status CacheState::MemoryUsedUp(const std::string& why, bool by_cap) {
  if (header_->state.load() & layout::kStateSpilling) {
    if (!(header_->state.fetch_or(layout::kStateMemFull) & layout::kStateMemFull) &&
        log_) {
      log_->Info("cache {}: {}; further rows spill to disk", cache_id_, why);
    }
    if (by_cap) cap_full_bits_ |= layout::kStateMemFull;
    return Status::Full(fmt::format("cache {} memory is full: {}; rows spill to disk",
                                    cache_id_, why));
  }
  MarkFull(why);
  if (by_cap) cap_full_bits_ |= layout::kStateFull;
  return Status::Full(fmt::format("cache {} is full: {}", cache_id_, why));
}

bool CacheState::ResumeIfCapAllows(const MemoryAccount& account) {
  if (cap_full_bits_ == 0 || destroyed_ || account.available() < kMinSegmentBytes) {
    return false;
  }
  header_->state.fetch_and(~cap_full_bits_);
  cap_full_bits_ = 0;
  if (log_) {
    log_->Info("cache {} (session {}, '{}') takes rows again: {} MB are free under "
               "the server's memory cap",
               cache_id_, session_id_, name_, account.available() >> 20);
  }
  return true;
}

Status CacheState::CreateSegmentFile(const InstancePaths& paths, uint32_t cache_id,
                                     uint32_t seg_no, int node, uint64_t size,
                                     ShmFile* out) {
  ShmFile f;
  Status s = ShmFile::Create(paths.SegmentFile(cache_id, seg_no), size, node, &f);
  if (!s.ok()) return s;
  FormatSegment(&f, cache_id, seg_no, node, size);
  *out = std::move(f);
  return Status::OK();
}

Status CacheState::CreateNextSegment(int node, uint64_t size, uint32_t* seg_no,
                                     ShmFile* out) {
  // Locations need segment numbers unique, not dense: a number whose name
  // another user took is skipped.
  const uint32_t first = next_seg_no_;
  const uint32_t tries = std::min(kSegmentNameTries, layout::kMaxSegmentId + 1 - first);
  auto name = [&](uint32_t i) { return paths_.SegmentFile(cache_id_, first + i); };
  uint32_t chosen;
  std::string skipped;
  Status s = ShmFile::CreateFresh(name, tries, size, node, out, &chosen, &skipped);
  if (!skipped.empty() && log_) log_->Warn("cache {}: skipped {}", cache_id_, skipped);
  // A number that failed otherwise (no room) was removed and is free again.
  next_seg_no_ = first + chosen + (s.ok() ? 1 : 0);
  if (!s.ok()) return s;
  FormatSegment(out, cache_id_, first + chosen, node, size);
  *seg_no = first + chosen;
  return Status::OK();
}

void CacheState::FormatSegment(ShmFile* f, uint32_t cache_id, uint32_t seg_no,
                               int node, uint64_t size) {
  auto* h = reinterpret_cast<layout::SegmentHeader*>(f->data());
  h->seg_id = seg_no;
  h->cache_id = cache_id;
  h->node = static_cast<uint32_t>(node);
  h->carved.store(layout::kSegmentHeaderSize);
  h->file.version = layout::kLayoutVersion;
  h->file.header_size = sizeof(layout::SegmentHeader);
  h->file.file_size = size;
  // The magic goes last: a file without it was never finished.
  std::atomic_thread_fence(std::memory_order_release);
  h->file.magic = layout::kSegmentMagic;
}

void CacheState::AddSegment(uint32_t seg_no, int node, uint64_t size, ShmFile file) {
  segments_.emplace(seg_no, Segment{seg_no, node, size, layout::kSegmentHeaderSize,
                                    std::move(file)});
  current_[static_cast<size_t>(node)] = static_cast<int>(seg_no);
}

Status CacheState::NewSegment(int node, uint64_t need, MemoryAccount* account,
                              Segment** out, bool* wait) {
  uint64_t min_bytes = layout::SegmentBytesFor(need);
  if (wait != nullptr && preparing_[static_cast<size_t>(node)]) {
    // Its memory is already reserved; making another would waste it, or
    // find the budget spent.
    *wait = true;
    return Status::OK();
  }
  auto& ready = prepared_[static_cast<size_t>(node)];
  if (ready && ready->size >= min_bytes) {
    uint32_t seg_no = ready->seg_no;
    AddSegment(seg_no, node, ready->size, std::move(ready->file));
    ready.reset();
    *out = &segments_.at(seg_no);
    return Status::OK();
  }
  uint64_t want = NextSegmentSize(min_bytes, *account);
  if (want == 0) return NoRoomFor(need, min_bytes, *account);
  if (next_seg_no_ > layout::kMaxSegmentId) {
    MarkFull("too many segments");
    return Status::Full("cache has too many segments");
  }
  uint32_t seg_no = 0;
  ShmFile f;
  Status s = CreateNextSegment(node, want, &seg_no, &f);
  if (!s.ok()) {
    if (s.IsFull()) MarkFull(s.message());
    if (log_) log_->Error("cache {}: {}", cache_id_, s.message());
    return s;
  }
  account->Reserve(want);
  data_bytes_ += want;
  AddReserved(want);
  AddSegment(seg_no, node, want, std::move(f));
  *out = &segments_.at(seg_no);
  return Status::OK();
}

std::optional<SegmentJob> CacheState::TakeSegmentJob(int node,
                                                     MemoryAccount* account) {
  size_t n = static_cast<size_t>(node);
  if (destroyed_ || preparing_[n] || prepared_[n] || current_[n] < 0) {
    return std::nullopt;
  }
  const Segment& cur = segments_.at(static_cast<uint32_t>(current_[n]));
  if (cur.size - cur.carved > cur.size / 2) return std::nullopt;
  uint64_t size = NextSegmentSize(kMinSegmentBytes, *account);
  if (size == 0 || next_seg_no_ > layout::kMaxSegmentId) return std::nullopt;
  // Reserved now, so that budgets and the cap hold while the file is made.
  account->Reserve(size);
  data_bytes_ += size;
  AddReserved(size);
  preparing_[n] = true;
  return SegmentJob{cache_id_, next_seg_no_++, node, size};
}

void CacheState::FinishSegmentJob(const SegmentJob& job, Status made, ShmFile file,
                                  MemoryAccount* account) {
  size_t n = static_cast<size_t>(job.node);
  if (destroyed_) {
    // Destroy already released the reservation and unlinked what it knew.
    ShmFile::Unlink(paths_.SegmentFile(cache_id_, job.seg_no)).PermitUncheckedError();
    return;
  }
  preparing_[n] = false;
  if (!made.ok()) {
    account->Release(job.size);
    data_bytes_ -= job.size;
    reserved_bytes_ -= job.size;
    header_->reserved_bytes.store(reserved_bytes_);
    if (log_) log_->Warn("cache {}: preparing a segment failed: {}", cache_id_, made.message());
    return;
  }
  prepared_[n] = Prepared{job.seg_no, job.size, std::move(file)};
}

layout::ChunkHeader* CacheState::ChunkAt(uint32_t seg_no, uint64_t offset,
                                         uint64_t size) {
  auto* h = reinterpret_cast<layout::ChunkHeader*>(
      segments_.at(seg_no).file.data() + offset);
  h->cache_id = cache_id_;
  h->size = size;
  h->used.store(sizeof(layout::ChunkHeader));
  h->magic = layout::kChunkMagic;
  return h;
}

Status CacheState::Lease(uint64_t conn, int node, uint64_t need,
                         MemoryAccount* account, ChunkLease* out, bool* wait) {
  if (wait != nullptr) *wait = false;
  if (destroyed_) return Status::NotFound("cache was destroyed");
  if (header_->state.load() & (layout::kStateFull | layout::kStateMemFull)) {
    return Status::Full(fmt::format("cache {} memory is full", cache_id_));
  }
  node = (node % num_nodes_ + num_nodes_) % num_nodes_;
  const uint64_t want = layout::ChunkBytesFor(need);
  auto& tails = tails_[static_cast<size_t>(node)];
  for (size_t i = 0; i < tails.size(); ++i) {
    if (tails[i].size >= want) {
      Tail t = tails[i];
      tails.erase(tails.begin() + static_cast<long>(i));
      ChunkAt(t.seg_no, t.offset, t.size);
      *out = ChunkLease{t.seg_no, t.offset, t.size};
      leases_[conn].push_back(*out);
      return Status::OK();
    }
  }
  Segment* seg = nullptr;
  int cur = current_[static_cast<size_t>(node)];
  if (cur >= 0 && segments_.at(static_cast<uint32_t>(cur)).size -
                         segments_.at(static_cast<uint32_t>(cur)).carved >= want) {
    seg = &segments_.at(static_cast<uint32_t>(cur));
  } else {
    Status s = NewSegment(node, want, account, &seg, wait);
    if (!s.ok() || (wait != nullptr && *wait)) return s;
  }
  uint64_t avail = seg->size - seg->carved;
  uint64_t size = std::min(avail, std::max(want, kChunkBytes));
  if (avail - size < kMinRecycleBytes) size = avail;  // no sliver left over
  size = size / layout::kCacheLine * layout::kCacheLine;
  uint64_t offset = seg->carved;
  ChunkAt(seg->seg_no, offset, size);
  seg->carved += size;
  reinterpret_cast<layout::SegmentHeader*>(seg->file.data())->carved.store(seg->carved);
  *out = ChunkLease{seg->seg_no, offset, size};
  leases_[conn].push_back(*out);
  return Status::OK();
}

void CacheState::Return(uint64_t conn, uint32_t seg_no, uint64_t offset) {
  auto it = leases_.find(conn);
  if (it == leases_.end() || destroyed_) return;
  auto& v = it->second;
  auto l = std::find_if(v.begin(), v.end(), [&](const ChunkLease& c) {
    return c.seg_no == seg_no && c.offset == offset;
  });
  if (l == v.end()) return;  // not this connection's: ignore
  ChunkLease lease = *l;
  v.erase(l);
  auto* h = reinterpret_cast<layout::ChunkHeader*>(
      segments_.at(lease.seg_no).file.data() + lease.offset);
  // `used` was written by the client: trust it only within the chunk.
  uint64_t used = h->used.load();
  if (used < sizeof(layout::ChunkHeader) || used > lease.size) used = lease.size;
  uint64_t tail_off = AlignUp(lease.offset + used, layout::kCacheLine);
  uint64_t end = lease.offset + lease.size;
  if (tail_off + kMinRecycleBytes <= end) {
    const Segment& seg = segments_.at(lease.seg_no);
    tails_[static_cast<size_t>(seg.node)].push_back(
        Tail{lease.seg_no, tail_off, end - tail_off});
  }
}

void CacheState::ReleaseConnection(uint64_t conn, bool recycle) {
  auto it = leases_.find(conn);
  if (it == leases_.end()) return;
  std::vector<ChunkLease> held = it->second;
  if (recycle) {
    for (const ChunkLease& l : held) Return(conn, l.seg_no, l.offset);
  }
  leases_.erase(conn);
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

bool CacheState::spilling() const {
  return header_ && layout::SpillingOn(header_->state.load());
}

void CacheState::StopSpilling(const std::string& why) {
  if (header_ == nullptr) return;
  uint32_t old = header_->state.fetch_and(~layout::kStateSpilling);
  if (old & layout::kStateMemFull) MarkFull("spilling stopped: " + why);
}

bool CacheState::spill_enabled() const {
  return header_ && (header_->state.load() & layout::kStateSpilling);
}

uint64_t CacheState::DropSpilledRows() {
  // Rows spill only once memory is used up, and kStateMemFull is never
  // cleared: without it, no slot needs looking at.
  if (header_ == nullptr || !(header_->state.load() & layout::kStateMemFull)) {
    return 0;
  }
  uint64_t dropped = 0;
  for (IndexTable& t : index_) dropped += t.RetireSpilled();
  for (layout::StatsSlot& slot : header_->stats) {
    slot.disk_rows.store(0, std::memory_order_relaxed);
    slot.disk_bytes.store(0, std::memory_order_relaxed);
  }
  return dropped;
}

std::string CacheState::Label() const {
  return fmt::format("cache {} (session {}, '{}')", cache_id_, session_id_, name_);
}

Status CacheState::PublishSpilled(uint64_t row_id, uint64_t bytes,
                                  MemoryAccount* account, bool* inserted) {
  *inserted = false;
  if (destroyed_) return Status::NotFound("cache was destroyed");
  for (const IndexTable& t : index_) {
    if (t.Find(row_id) != layout::kEmpty) return Status::OK();
  }
  for (;;) {
    switch (index_.back().Insert(row_id, layout::kSpilledBit)) {
      case IndexTable::InsertResult::kInserted:
        header_->stats[0].disk_rows.fetch_add(1, std::memory_order_relaxed);
        header_->stats[0].disk_bytes.fetch_add(bytes, std::memory_order_relaxed);
        *inserted = true;
        return Status::OK();
      case IndexTable::InsertResult::kExists:
        return Status::OK();
      case IndexTable::InsertResult::kTableFull: {
        Status s = GrowIndex(static_cast<uint32_t>(index_.size()), account);
        if (!s.ok()) return s;
      }
    }
  }
}

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
    return Status::Full(fmt::format(
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
  if (const char* bad = layout::CheckFileHeader(header_file_.data(), header_file_.size(),
                                                layout::kCacheMagic,
                                                sizeof(layout::CacheHeader))) {
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
  if (const char* bad = layout::CheckTableFile(f.data(), f.size(),
                                               header_->tables[gen].capacity.load(), gen)) {
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
  if (sh->node >= static_cast<uint32_t>(num_nodes_) ||
      carved < layout::kSegmentHeaderSize || carved > f.size()) {
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

CacheStats CacheState::Stats() const {
  CacheStats out;
  if (header_ != nullptr) {
    out = ReadCacheStats(*header_, num_nodes_ == 1);
    out.spill_reads = spill_reads_;
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
