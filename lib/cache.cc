#include "shmcache/cache.h"

#include <algorithm>
#include <cstring>
#include <fmt/format.h>

#include <unistd.h>

#include "cache_impl.h"
#include "numa_topology.h"
#include "row_codec.h"

namespace shmcache {

using protocol::MsgType;
using protocol::WireReader;
using protocol::WireWriter;

CacheImpl::CacheImpl(std::shared_ptr<ClientImpl> client, uint32_t cache_id,
                     uint32_t session_id)
    : client_(std::move(client)), cache_id_(cache_id), session_id_(session_id) {}

CacheImpl::~CacheImpl() { Close(); }

Status CacheImpl::Attach(std::shared_ptr<ClientImpl> client, uint32_t cache_id,
                         uint32_t session_id, std::shared_ptr<CacheImpl>* out) {
  std::shared_ptr<CacheImpl> c(new CacheImpl(client, cache_id, session_id));
  std::string path = client->paths().CacheFile(cache_id);
  Status s = ShmFile::Open(path, &c->header_file_);
  if (!s.ok()) return s;
  if (const char* bad = layout::CheckFileHeader(
          c->header_file_.data(), c->header_file_.size(), layout::kCacheMagic,
          sizeof(layout::CacheHeader))) {
    return Status::Corruption(path + ": " + bad);
  }
  c->header_ = reinterpret_cast<layout::CacheHeader*>(c->header_file_.data());
  if (c->header_->cache_id != cache_id || c->header_->session_id != session_id) {
    return Status::Corruption(path + ": belongs to another cache");
  }
  c->stats_slot_.store(client->client_id() % layout::kStatsSlots);
  c->stats_fork_gen_.store(ForkGeneration());
  c->chunks_.resize(static_cast<size_t>(NumaTopology::Get().num_nodes()));
  c->single_node_ = NumaTopology::Get().num_nodes() == 1;
  c->chunk_fork_gen_ = ForkGeneration();
  s = c->MapNewTables();
  if (!s.ok()) return s;
  *out = std::move(c);
  return Status::OK();
}

Status CacheImpl::Usable() const {
  if (closed_.load(std::memory_order_relaxed)) {
    return Status::InvalidArgument("cache is closed");
  }
  if (header_->state.load(std::memory_order_relaxed) & layout::kStateDestroyed) {
    return Status::NotFound(
        fmt::format("session {} was destroyed", session_id_));
  }
  return Status::OK();
}

Status CacheImpl::MapNewTables() {
  std::lock_guard lock(map_mu_);
  uint32_t have = num_tables_.load(std::memory_order_relaxed);
  uint32_t want = header_->num_tables.load(std::memory_order_acquire);
  if (want > layout::kMaxTables) return Status::Corruption("too many index tables");
  for (uint32_t g = have; g < want; ++g) {
    uint64_t cap = header_->tables[g].capacity.load(std::memory_order_acquire);
    std::string path = client_->paths().TableFile(cache_id_, g, header_->tables[g].tag);
    ShmFile f;
    Status s = ShmFile::Open(path, &f);
    if (!s.ok()) return s;
    if (const char* bad = layout::CheckTableFile(f.data(), f.size(), cap, g)) {
      return Status::Corruption(path + ": " + bad);
    }
    tables_[g] = IndexTable(reinterpret_cast<layout::TableHeader*>(f.data()));
    table_files_[g] = std::move(f);
    num_tables_.store(g + 1, std::memory_order_release);
  }
  return Status::OK();
}

uint64_t CacheImpl::Lookup(uint64_t id) {
  uint32_t n = num_tables_.load(std::memory_order_acquire);
  if (n < header_->num_tables.load(std::memory_order_acquire)) {
    // A mapping failure leaves the tables we have; they are still right.
    MapNewTables().PermitUncheckedError();
    n = num_tables_.load(std::memory_order_acquire);
  }
  for (uint32_t i = n; i-- > 0;) {
    uint64_t loc = tables_[i].Find(id);
    if (loc != layout::kEmpty) return loc;
  }
  return layout::kEmpty;
}

Status CacheImpl::SegmentFor(uint32_t seg_no, const MappedSegment** out) {
  if (const MappedSegment* m = segments_.Find(seg_no)) {
    *out = m;
    return Status::OK();
  }
  std::lock_guard lock(map_mu_);
  if (const MappedSegment* m = segments_.Find(seg_no)) {
    *out = m;
    return Status::OK();
  }
  std::string path = client_->paths().SegmentFile(cache_id_, seg_no);
  ShmFile f, read_only;
  Status s = ShmFile::Open(path, &f, &read_only);
  if (!s.ok()) return s;
  if (const char* bad = layout::CheckSegmentFile(f.data(), f.size(), cache_id_, seg_no)) {
    return Status::Corruption(path + ": " + bad);
  }
  int node = static_cast<int>(reinterpret_cast<layout::SegmentHeader*>(f.data())->node);
  *out = segments_.Insert(seg_no, std::move(f), std::move(read_only), node);
  return *out ? Status::OK() : Status::Corruption("segment number out of range");
}

Status CacheImpl::Resolve(uint64_t id, uint64_t loc, RowView* view, int* node) {
  const MappedSegment* seg = segments_.Find(layout::LocationSegment(loc));
  if (seg == nullptr) {
    Status s = SegmentFor(layout::LocationSegment(loc), &seg);
    if (!s.ok()) return s;
  }
  uint64_t off = layout::LocationOffset(loc);
  if (off < layout::kSegmentHeaderSize || off >= seg->size || off % 8 != 0) {
    return Status::Corruption("index entry points outside its segment");
  }
  if (!RowCodec::DecodeHeader(reinterpret_cast<const std::byte*>(seg->read_base + off),
                              seg->size - off, id, view)) {
    return Status::Corruption(
        fmt::format("index entry for row {} points at a row that does not match", id));
  }
  view->in_shared_memory_ = true;
  *node = seg->node;
  return Status::OK();
}

layout::StatsSlot* CacheImpl::Stats() {
  // A forked child would share its parent's line: give it its own.
  if (stats_fork_gen_.load(std::memory_order_relaxed) != ForkGeneration()) {
    stats_fork_gen_.store(ForkGeneration(), std::memory_order_relaxed);
    stats_slot_.store((client_->client_id() + static_cast<uint32_t>(getpid())) %
                          layout::kStatsSlots,
                      std::memory_order_relaxed);
  }
  return &header_->stats[stats_slot_.load(std::memory_order_relaxed)];
}

void CacheImpl::CountRead(bool hit, int node) {
  layout::StatsSlot* slot = Stats();
  if (!hit) {
    slot->misses.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  slot->hits.fetch_add(1, std::memory_order_relaxed);
  // On a single-node host every hit is a Numa hit: the readers of the
  // statistics count them, and the hit path saves a locked add.
  if (!single_node_ && node == NumaTopology::Get().CurrentNode()) {
    slot->numa_hits.fetch_add(1, std::memory_order_relaxed);
  }
}

Status CacheImpl::Materialize(uint64_t id, uint64_t loc,
                              std::span<const std::string_view> columns,
                              bool project, Row* out) {
  if (loc & layout::kSpilledBit) {
    Row* target = out;
    Row disk_row;
    if (project) target = &disk_row;
    Status s;
    FetchSpilled(std::span(&id, 1), &target, &s);
    if (!s.ok()) return s;
    if (project) s = RowCodec::Project(disk_row.view(), columns, out);
    if (s.ok()) CountRead(true, -1);
    return s;
  }
  RowView v;
  int node = 0;
  Status s = Resolve(id, loc, &v, &node);
  if (!s.ok()) return s;
  if (project) {
    s = RowCodec::Project(v, columns, out);
    if (!s.ok()) return s;
  } else {
    RowCodec::Copy(v, out);
  }
  CountRead(true, node);
  return Status::OK();
}

static Status Miss(uint64_t id) {
  return Status::NotFound(fmt::format("row {} is not cached", id));
}

Status CacheImpl::Locate(uint64_t id, uint64_t* loc) {
  Status s = Usable();
  if (!s.ok()) return s;
  *loc = Lookup(id);
  if (*loc == layout::kEmpty) {
    CountRead(false, 0);
    return Miss(id);
  }
  return Status::OK();
}

Status CacheImpl::Get(uint64_t id, std::span<const std::string_view> columns,
                      bool project, Row* out) {
  uint64_t loc;
  Status s = Locate(id, &loc);
  if (!s.ok()) return s;
  return Materialize(id, loc, columns, project, out);
}

void CacheImpl::LookupBatch(std::span<const uint64_t> ids, uint64_t* locs) {
  uint32_t n = num_tables_.load(std::memory_order_acquire);
  if (n < header_->num_tables.load(std::memory_order_acquire)) {
    MapNewTables().PermitUncheckedError();
    n = num_tables_.load(std::memory_order_acquire);
  }
  for (uint64_t id : ids) {
    for (uint32_t t = 0; t < n; ++t) tables_[t].Prefetch(id);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    locs[i] = Lookup(ids[i]);
    if (locs[i] == layout::kEmpty || (locs[i] & layout::kSpilledBit)) continue;
    if (const MappedSegment* seg = segments_.Find(layout::LocationSegment(locs[i]))) {
      uint64_t off = layout::LocationOffset(locs[i]);
      if (off < seg->size) __builtin_prefetch(seg->read_base + off);
    }
  }
}

// Batches are looked up in windows: enough ids to overlap their misses, few
// enough that the prefetched lines are still in cache when used.
static constexpr size_t kBatchWindow = 32;

Status CacheImpl::ViewBatch(std::span<const uint64_t> ids, RowView* views,
                            Status* statuses) {
  Status s = Usable();
  if (!s.ok()) return s;
  uint64_t locs[kBatchWindow];
  for (size_t base = 0; base < ids.size(); base += kBatchWindow) {
    auto window = ids.subspan(base, std::min(kBatchWindow, ids.size() - base));
    LookupBatch(window, locs);
    for (size_t k = 0; k < window.size(); ++k) {
      size_t i = base + k;
      if (locs[k] == layout::kEmpty) {
        CountRead(false, 0);
        statuses[i] = Miss(ids[i]);
      } else if (locs[k] & layout::kSpilledBit) {
        statuses[i] = Status::NotSupported(
            "a spilled row has no shared memory to view; use GetBatch");
      } else {
        int node = 0;
        statuses[i] = Resolve(ids[i], locs[k], &views[i], &node);
        if (statuses[i].ok()) CountRead(true, node);
      }
    }
  }
  return Status::OK();
}

Status CacheImpl::GetBatch(std::span<const uint64_t> ids, Row* rows,
                           Status* statuses) {
  Status s = Usable();
  if (!s.ok()) return s;
  std::vector<uint64_t> spilled;
  std::vector<Row*> targets;
  std::vector<size_t> where;
  uint64_t locs[kBatchWindow];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % kBatchWindow == 0) {
      LookupBatch(ids.subspan(i, std::min(kBatchWindow, ids.size() - i)), locs);
    }
    uint64_t loc = locs[i % kBatchWindow];
    if (loc == layout::kEmpty) {
      CountRead(false, 0);
      statuses[i] = Miss(ids[i]);
    } else if (loc & layout::kSpilledBit) {
      spilled.push_back(ids[i]);
      targets.push_back(&rows[i]);
      where.push_back(i);
    } else {
      statuses[i] = Materialize(ids[i], loc, {}, false, &rows[i]);
    }
  }
  if (spilled.empty()) return Status::OK();
  std::vector<Status> got(spilled.size());
  FetchSpilled(spilled, targets.data(), got.data());
  for (size_t k = 0; k < spilled.size(); ++k) {
    if (got[k].ok()) CountRead(true, -1);
    statuses[where[k]] = std::move(got[k]);
  }
  return Status::OK();
}

void CacheImpl::FetchSpilled(std::span<const uint64_t> ids, Row* const* rows,
                             Status* statuses) {
  size_t done = 0;
  while (done < ids.size()) {
    size_t n = std::min<size_t>(ids.size() - done, protocol::kMaxSpillBatch);
    WireWriter w;
    w.U32(cache_id_);
    w.U32(static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) w.U64(ids[done + i]);
    std::string body;
    WireReader r({});
    Status s = client_->Call(MsgType::kSpillGet, w, &body, &r);
    uint32_t count = s.ok() ? r.U32() : 0;
    if (s.ok() && count != n) s = Status::Corruption("malformed spill response");
    if (!s.ok()) {
      for (size_t i = done; i < ids.size(); ++i) statuses[i] = s;
      return;
    }
    size_t answered = 0;
    for (size_t i = 0; i < n; ++i) {
      size_t k = done + i;
      uint8_t mark = r.U8();
      if (mark == protocol::kSpillAskAgain) break;
      ++answered;
      if (mark != protocol::kSpillFound) {
        statuses[k] = Miss(ids[k]);
        continue;
      }
      std::span<const std::byte> bytes = r.Bytes();
      if (!r.ok()) {
        statuses[k] = Status::Corruption("malformed spill response");
        continue;
      }
      std::memcpy(RowCodec::Reserve(rows[k], bytes.size()), bytes.data(), bytes.size());
      statuses[k] = RowCodec::Adopt(rows[k], bytes.size());
      if (statuses[k].ok() && RowCodec::KeyOf(rows[k]->view()) != ids[k]) {
        statuses[k] = Status::Corruption("spilled row carries another id");
      }
    }
    if (answered == 0) {  // the daemon answers a first row always; never spin
      for (size_t i = done; i < ids.size(); ++i) {
        statuses[i] = Status::Corruption("the cache server answered none of the "
                                         "spilled rows asked for");
      }
      return;
    }
    done += answered;
  }
}

Status CacheImpl::View(uint64_t id, RowView* out) {
  uint64_t loc;
  Status s = Locate(id, &loc);
  if (!s.ok()) return s;
  if (loc & layout::kSpilledBit) {
    // A disk row has no shared memory to point into: the view points into
    // this thread's buffer, valid until the thread's next View of a disk row.
    static thread_local Row disk_row;
    s = Materialize(id, loc, {}, false, &disk_row);
    if (s.ok()) *out = disk_row.view();
    return s;
  }
  int node = 0;
  s = Resolve(id, loc, out, &node);
  if (!s.ok()) return s;
  CountRead(true, node);
  return Status::OK();
}

bool CacheImpl::Contains(uint64_t id) {
  return Usable().ok() && Lookup(id) != layout::kEmpty;
}

bool CacheImpl::IsFull() const {
  return header_->state.load(std::memory_order_relaxed) & layout::kStateFull;
}

Status CacheImpl::LeaseChunk(int node, size_t need, Chunk* c) {
  WireWriter w;
  w.U32(cache_id_);
  w.U32(static_cast<uint32_t>(node));
  w.U64(need);
  w.U8(c->base != nullptr ? 1 : 0);  // hand back the old chunk's tail
  w.U32(c->seg_no);
  w.U64(c->offset);
  std::string body;
  WireReader r({});
  Status s = client_->Call(MsgType::kLeaseChunk, w, &body, &r);
  // On failure the daemon kept nothing of the old chunk: it stays ours.
  if (!s.ok()) return s;
  *c = Chunk{};
  uint32_t seg_no = r.U32();
  uint64_t offset = r.U64();
  uint64_t size = r.U64();
  if (!r.Done()) return Status::Corruption("malformed lease response");
  const MappedSegment* seg;
  s = SegmentFor(seg_no, &seg);
  if (!s.ok()) return s;
  if (offset < layout::kSegmentHeaderSize || offset % layout::kCacheLine != 0 ||
      size < sizeof(layout::ChunkHeader) + need || offset + size > seg->size) {
    return Status::Corruption("leased chunk lies outside its segment");
  }
  auto* h = reinterpret_cast<layout::ChunkHeader*>(seg->base + offset);
  if (h->magic != layout::kChunkMagic || h->cache_id != cache_id_ ||
      h->size != size) {
    return Status::Corruption("leased chunk header does not match");
  }
  // This process writes the whole chunk: map its pages now, 16 per fault
  // (the daemon allocated and cleared them). Readers map segments lazily
  // instead: a fault maps a 64 KB window.
  PopulateForWrite(seg->base + offset, size);
  c->seg_no = seg_no;
  c->offset = offset;
  c->base = seg->base + offset;
  c->size = size;
  c->used = h->used.load(std::memory_order_relaxed);
  c->header = h;
  return Status::OK();
}

Status CacheImpl::GrowIndex(uint32_t seen) {
  WireWriter w;
  w.U32(cache_id_);
  w.U32(seen);
  std::string body;
  WireReader r({});
  Status s = client_->Call(MsgType::kGrowIndex, w, &body, &r);
  if (!s.ok()) return s;
  return MapNewTables();
}

Status CacheImpl::Put(uint64_t id, std::span<const ColumnRef> columns,
                      bool* inserted) {
  Status status;
  bool added = false;
  PutBatch(std::span(&id, 1), std::span(&columns, 1), &status, &added)
      .PermitUncheckedError();  // an unusable cache is in `status` too
  if (inserted) *inserted = added;
  return status;
}

// A row that meets one of these ends its batch: the cache takes no more.
static bool EndsBatch(const Status& s) { return s.IsFull() || s.IsUnavailable(); }

Status CacheImpl::PutBatch(std::span<const uint64_t> ids,
                           std::span<const std::span<const ColumnRef>> rows,
                           Status* statuses, bool* inserted) {
  if (inserted) std::fill(inserted, inserted + ids.size(), false);
  Status s = Usable();
  if (!s.ok()) {
    std::fill(statuses, statuses + ids.size(), s);
    return s;
  }
  PutLock lock(put_mu_, std::defer_lock);
  PutTally tally;
  uint64_t locs[kBatchWindow];
  bool added = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % kBatchWindow == 0) {
      LookupBatch(ids.subspan(i, std::min(kBatchWindow, ids.size() - i)), locs);
    }
    statuses[i] = PutRow(ids[i], rows[i], locs[i % kBatchWindow], &lock, &tally,
                         &added);
    if (inserted) inserted[i] = added;
    if (EndsBatch(statuses[i])) {
      std::fill(statuses + i + 1, statuses + ids.size(), statuses[i]);
      if (statuses[i].IsFull()) {
        Stats()->puts_full.fetch_add(ids.size() - i, std::memory_order_relaxed);
      }
      break;
    }
  }
  if (tally.rows > 0) {
    layout::StatsSlot* slot = Stats();
    slot->rows.fetch_add(tally.rows, std::memory_order_relaxed);
    slot->bytes.fetch_add(tally.bytes, std::memory_order_relaxed);
  }
  return Status::OK();
}

void CacheImpl::LockForPut(PutLock* lock) {
  if (lock->owns_lock()) return;
  lock->lock();
  if (chunk_fork_gen_ != ForkGeneration()) {
    // The chunks belong to the parent process: never write into them.
    for (Chunk& c : chunks_) c = Chunk{};
    chunk_fork_gen_ = ForkGeneration();
  }
}

Status CacheImpl::PutRow(uint64_t id, std::span<const ColumnRef> columns,
                         uint64_t loc, PutLock* lock, PutTally* tally,
                         bool* inserted) {
  *inserted = false;
  if (IsFull()) {
    return Status::Full(fmt::format("cache {} is full", cache_id_));
  }
  if (loc != layout::kEmpty) return Status::OK();
  size_t size;
  Status s = RowCodec::EncodedSize(columns, &size);
  if (!s.ok()) return s;
  if (SpillsNow()) return SpillPut(id, columns, size, inserted);
  s = CheckRowFits(id, size);
  if (!s.ok()) return SpillingOn() ? SpillPut(id, columns, size, inserted) : s;
  LockForPut(lock);
  return PutInMemory(id, columns, size, tally, inserted);
}

Status CacheImpl::PutInMemory(uint64_t id, std::span<const ColumnRef> columns,
                              size_t size, PutTally* tally, bool* inserted) {
  size_t node = static_cast<size_t>(NumaTopology::Get().CurrentNode()) %
                chunks_.size();
  Chunk& c = chunks_[node];
  Status s;
  if (c.base == nullptr || c.size - c.used < size) {
    s = LeaseChunk(static_cast<int>(node), size, &c);
    if (s.IsFull() && SpillsNow()) return SpillPut(id, columns, size, inserted);
    if (s.IsTooLarge()) {
      // Only this row: the cache goes on taking smaller ones in memory.
      if (SpillingOn()) return SpillPut(id, columns, size, inserted);
      return Status::TooLarge(fmt::format("row {}: {}", id, s.message()));
    }
    if (!s.ok()) return s;
  }
  // Reserve before writing: whatever lies past `used` may be re-leased by
  // the daemon if this process dies, so the row must be inside it first.
  uint64_t off = c.used;
  c.used += size;
  c.header->used.store(c.used, std::memory_order_relaxed);
  RowCodec::Encode(id, columns, reinterpret_cast<std::byte*>(c.base + off), size);
  uint64_t loc = layout::MakeLocation(c.seg_no, c.offset + off);
  for (;;) {
    uint32_t n = num_tables_.load(std::memory_order_acquire);
    IndexTable::InsertResult r = tables_[n - 1].Insert(id, loc);
    if (r == IndexTable::InsertResult::kInserted) {
      ++tally->rows;
      tally->bytes += size;
      *inserted = true;
      return Status::OK();
    }
    if (r == IndexTable::InsertResult::kExists) break;
    s = GrowIndex(n);
    if (!s.ok()) break;
  }
  // Not published: the space is still ours alone, take it back.
  c.used = off;
  c.header->used.store(off, std::memory_order_relaxed);
  return s;
}

Status CacheImpl::CheckRowFits(uint64_t id, size_t size) const {
  const uint64_t budget = header_->budget_bytes;
  if (size <= protocol::kMaxLeaseBytes &&
      layout::SegmentBytesFor(layout::ChunkBytesFor(size)) <= budget) {
    return Status::OK();
  }
  return Status::TooLarge(fmt::format(
      "row {} of {:.1f} MB needs more than cache {}'s whole memory budget of {} MB; "
      "it is not cached, smaller rows still are",
      id, static_cast<double>(size) / (1 << 20), cache_id_, budget >> 20));
}

bool CacheImpl::SpillingOn() const {
  return header_->state.load(std::memory_order_relaxed) & layout::kStateSpilling;
}

bool CacheImpl::SpillsNow() const {
  return layout::SpillsNow(header_->state.load(std::memory_order_relaxed));
}

Status CacheImpl::SpillPut(uint64_t id, std::span<const ColumnRef> columns,
                           size_t size, bool* inserted) {
  // Checked before anything is sent: a frame over the limit would make the
  // daemon drop the connection.
  if (size > protocol::kMaxSpilledRowBytes) {
    return protocol::SpilledRowTooLarge(id, size);
  }
  static thread_local std::vector<uint64_t> buf;
  buf.resize((size + 7) / 8);
  auto* bytes = reinterpret_cast<std::byte*>(buf.data());
  RowCodec::Encode(id, columns, bytes, size);
  WireWriter w;
  w.U32(cache_id_);
  w.U64(id);
  w.Bytes(std::span<const std::byte>(bytes, size));
  std::string body;
  WireReader r({});
  Status s = client_->Call(MsgType::kSpillPut, w, &body, &r);
  if (!s.ok()) return s;
  bool added = r.U8() != 0;
  if (inserted) *inserted = added;
  return Status::OK();
}

Status CacheImpl::GetStats(CacheStats* out) {
  *out = CacheStats{};
  out->session_id = session_id_;
  out->cache_id = cache_id_;
  out->name.assign(header_->name, header_->name_len);
  for (const layout::StatsSlot& slot : header_->stats) {
    out->hits += slot.hits.load(std::memory_order_relaxed);
    out->misses += slot.misses.load(std::memory_order_relaxed);
    out->numa_hits += slot.numa_hits.load(std::memory_order_relaxed);
    out->mem_rows += slot.rows.load(std::memory_order_relaxed);
    out->mem_bytes += slot.bytes.load(std::memory_order_relaxed);
    out->disk_rows += slot.disk_rows.load(std::memory_order_relaxed);
    out->disk_bytes += slot.disk_bytes.load(std::memory_order_relaxed);
    out->puts_full += slot.puts_full.load(std::memory_order_relaxed);
  }
  if (single_node_) out->numa_hits = out->hits;
  out->reserved_bytes = header_->reserved_bytes.load(std::memory_order_relaxed);
  out->budget_bytes = header_->budget_bytes;
  out->full = IsFull();
  out->spilling = SpillsNow();
  return Usable();
}

void CacheImpl::ReturnChunksLocked() {
  if (chunk_fork_gen_ != ForkGeneration()) return;  // the parent's chunks
  for (Chunk& c : chunks_) {
    if (c.base == nullptr) continue;
    WireWriter w;
    w.U32(cache_id_);
    w.U32(c.seg_no);
    w.U64(c.offset);
    std::string body;
    WireReader r({});
    // The daemon reclaims the tail on disconnect anyway.
    client_->Call(MsgType::kReturnChunk, w, &body, &r).PermitUncheckedError();
    c = Chunk{};
  }
}

void CacheImpl::Close() {
  if (closed_.exchange(true)) return;
  std::lock_guard lock(put_mu_);
  ReturnChunksLocked();
}

// ---- Cache --------------------------------------------------------------

Cache::Cache(std::shared_ptr<CacheImpl> impl) : impl_(std::move(impl)) {}
Cache::~Cache() = default;

Status Cache::Put(uint64_t id, std::span<const ColumnRef> columns,
                  bool* inserted) {
  return impl_->Put(id, columns, inserted);
}

Status Cache::Put(uint64_t id, const void* data, size_t nbytes,
                  bool* inserted) {
  int64_t shape[1] = {static_cast<int64_t>(nbytes)};
  ColumnRef col{"data", DType::kUInt8, shape, data, nbytes};
  return impl_->Put(id, std::span(&col, 1), inserted);
}

Status Cache::PutBatch(std::span<const uint64_t> ids,
                       std::span<const std::span<const ColumnRef>> rows,
                       Status* statuses, bool* inserted) {
  return impl_->PutBatch(ids, rows, statuses, inserted);
}

Status Cache::Get(uint64_t id, Row* out) { return impl_->Get(id, {}, false, out); }

Status Cache::Get(uint64_t id, std::span<const std::string_view> columns,
                  Row* out) {
  return impl_->Get(id, columns, true, out);
}

Status Cache::View(uint64_t id, RowView* out) { return impl_->View(id, out); }
Status Cache::GetBatch(std::span<const uint64_t> ids, Row* rows, Status* statuses) {
  return impl_->GetBatch(ids, rows, statuses);
}
Status Cache::ViewBatch(std::span<const uint64_t> ids, RowView* views,
                        Status* statuses) {
  return impl_->ViewBatch(ids, views, statuses);
}
bool Cache::Contains(uint64_t id) { return impl_->Contains(id); }
Status Cache::GetStats(CacheStats* out) { return impl_->GetStats(out); }
bool Cache::IsFull() const { return impl_->IsFull(); }
uint32_t Cache::cache_id() const { return impl_->cache_id(); }
uint32_t Cache::session_id() const { return impl_->session_id(); }
void Cache::Close() { impl_->Close(); }

}  // namespace shmcache
