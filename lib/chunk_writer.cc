#include "lib/chunk_writer.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "format/numa_topology.h"
#include "format/row_codec.h"
#include "format/shm_file.h"

namespace shmcache {

ChunkWriter::ChunkWriter(std::shared_ptr<ClientImpl> client, uint32_t cache_id,
                         int num_nodes, SegmentSet* segments, TableSet* tables,
                         StatsLanes* stats)
    : client_(std::move(client)),
      cache_id_(cache_id),
      segments_(segments),
      tables_(tables),
      stats_(stats) {
  ForkSafeLock lock(&mu_);  // nobody else sees the writer yet; for the analysis
  chunks_.resize(static_cast<size_t>(num_nodes));
  fork_gen_ = ForkGeneration();
}

void ChunkWriter::Lock(BatchLock* lock) {
  if (lock->lock_.owns_lock()) {
    mu_.AssertHeld();
    return;
  }
  lock->asked_ = std::chrono::steady_clock::now();
  lock->lock_.lock();
  mu_.AssertHeld();
  if (fork_gen_ != ForkGeneration()) {
    // The chunks belong to the parent process: never write into them.
    for (Chunk& c : chunks_) c = Chunk{};
    fork_gen_ = ForkGeneration();
  }
  // Rows of a batch that was forked away with its thread (a child) or left
  // unpublished: never published; their room is lost, as a killed
  // writer's is.
  deferred_.clear();
}

Status ChunkWriter::Lease(int node, size_t need, Chunk* c, bool mapped) {
  protocol::LeaseChunkResponse lease;
  Status s = client_->Call(
      protocol::LeaseChunkRequest{.cache_id = cache_id_,
                                  .node = static_cast<uint32_t>(node),
                                  .need = need,
                                  .has_old = c->base != nullptr,  // its tail comes back
                                  .old_seg_no = c->seg_no,
                                  .old_offset = c->offset},
      &lease);
  if (!s.ok()) {
    // A refusal the daemon answered kept nothing of the old chunk: it stays
    // ours. No answer (Unavailable: a timeout, a broken connection) or one
    // that could not be read (Corruption) may hide a lease granted, and
    // with it the old chunk's tail taken back for the next writer: the old
    // chunk is never written again (what is lost is its tail's space).
    if (c->base != nullptr && (s.IsUnavailable() || s.IsCorruption())) *c = Chunk{};
    return s;
  }
  *c = Chunk{};
  const uint32_t seg_no = lease.seg_no;
  const uint64_t offset = lease.offset, size = lease.size;
  const MappedSegment* seg;
  s = segments_->Map(seg_no, &seg);
  if (!s.ok()) return s;
  if (offset < layout::kSegmentHeaderSize || offset % layout::kCacheLine != 0 ||
      size < sizeof(layout::ChunkHeader) + need || offset + size > seg->size) {
    return Status::Corruption("leased chunk lies outside its segment");
  }
  auto* h = reinterpret_cast<layout::ChunkHeader*>(seg->base + offset);
  if (h->magic != layout::kChunkMagic || h->cache_id != cache_id_ || h->size != size) {
    return Status::Corruption("leased chunk header does not match");
  }
  // This process writes the whole chunk: map its pages now, 16 per fault
  // (the daemon allocated and cleared them). Readers map segments lazily
  // instead: a fault maps a 64 KB window. Where rows are written through
  // the descriptor the daemon left the pages uncleared: a batch's writes
  // need no mapping, and a chunk leased for writes through the mapping
  // (single puts) is cleared and mapped in one call, cheaper than a fault
  // per page.
  if (seg->fd < 0) {
    PopulateForWrite(seg->base + offset, size);
  } else if (mapped) {
    PopulateUnclearedForWrite(seg->base + offset, size);
  }
  c->fd = seg->fd;
  c->seg = seg;
  c->seg_no = seg_no;
  c->offset = offset;
  c->base = seg->base + offset;
  c->size = size;
  // As the daemon formatted it; the mark may hold kRoomTaken already
  // (another writer's lease took the chunk's end): MoveUsed reads it.
  c->used = sizeof(layout::ChunkHeader);
  c->header = h;
  return Status::OK();
}

Status ChunkWriter::Write(uint64_t id, std::span<const ColumnRef> columns, size_t size,
                          BatchLock* lock, Tally* tally, bool* inserted,
                          bool* lease_failed, const Status* refusal) {
  *inserted = false;
  *lease_failed = false;
  Lock(lock);
  if (closed_) return Status::InvalidArgument("cache is closed");
  const size_t node =
      static_cast<size_t>(NumaTopology::Get().CurrentNode()) % chunks_.size();
  Chunk& c = chunks_[node];
  Status s;
  refused_ = refused_ && refusal != nullptr;
  bool defer = false;
  // A row put alone goes through the mapping unless it is large (see
  // kLargeRowBytes): a batch's rows are deferred instead.
  const bool alone = lock->statuses_ == nullptr;
  const bool large = alone && size >= kLargeRowBytes;
  for (;;) {
    if (refused_ || c.base == nullptr || c.size - c.used < size) {
      if (refusal != nullptr) {
        refused_ = true;
        *lease_failed = true;
        return *refusal;
      }
      if (unanswered_at_ > lock->asked_) {
        *lease_failed = true;
        return Status::Unavailable(
            "the cache server did not answer a lease asked by another thread while "
            "this one waited to put");
      }
      // The queued rows lie in the chunk the lease trades in.
      if (!Publish(lock, tally)) return lock->ended_status_;
      if (stats_ != nullptr && tally->rows > 0) {
        stats_->CountPuts(tally->rows, tally->bytes);
        *tally = {};
      }
      s = Lease(static_cast<int>(node), size, &c, alone && !large);
      if (!s.ok()) {
        if (s.IsUnavailable()) unanswered_at_ = std::chrono::steady_clock::now();
        // A row refused for want of a chunk is a refusal too: full stays
        // full for this writer (the chunk's room is not used after it).
        if (s.IsFull()) refused_ = true;
        *lease_failed = true;
        return s;
      }
    }
    // Queued rows are published before a row that is not queued, or one
    // for another node's chunk (the thread moved).
    defer = c.fd >= 0 && !alone;
    if ((!defer || deferred_node_ != node) && !Publish(lock, tally)) {
      return lock->ended_status_;
    }
    if (defer) {
      for (const Deferred& d : deferred_) {
        if (d.id == id) return Status::OK();  // the first row of the batch wins
      }
    }
    // Reserve before writing: whatever lies past `used` may be re-leased by
    // the daemon if this process dies, or taken back for another writer
    // (then the chunk ends before this row: a lease again).
    if (MoveUsed(&c, c.used + size)) break;
  }
  const uint64_t off = c.used - size;
  if (defer) {
    deferred_.push_back({id, columns, size, off, lock->row_});
    deferred_node_ = node;
    return Status::OK();
  }
  if (large && c.fd >= 0) {
    // Written now, as a batch of one row, and published below.
    deferred_.push_back({id, columns, size, off, lock->row_});
    WriteDeferred(&c, lock);
    deferred_.clear();
  } else {
    RowCodec::Encode(id, columns, reinterpret_cast<std::byte*>(c.base + off), size);
  }
  return Insert(id, size, off, &c, tally, inserted);
}

Status ChunkWriter::Insert(uint64_t id, uint64_t size, uint64_t off, Chunk* c,
                           Tally* tally, bool* inserted) {
  const uint64_t loc = layout::MakeLocation(c->seg_no, c->offset + off);
  Status s;
  for (;;) {
    uint32_t tables = 0;
    const TableSet::Published r = tables_->Publish(id, loc, &tables);
    if (r == TableSet::Published::kInserted || r == TableSet::Published::kBehind) {
      ++tally->rows;
      tally->bytes += size;
      *inserted = true;
      return r == TableSet::Published::kBehind ? CarryForward(id, loc, tables)
                                               : Status::OK();
    }
    if (r == TableSet::Published::kExists) break;
    s = GrowIndex(tables);
    if (!s.ok()) break;
  }
  // Not published: the space is still ours alone; take it back when
  // nothing lies past it (a deferred row's later neighbours may).
  if (off + size == c->used) MoveUsed(c, off);
  return s;
}

Status ChunkWriter::CarryForward(uint64_t id, uint64_t loc, uint32_t tables) {
  // Each round grows the index past the tables seen (or maps the tables
  // another writer added): it ends when the row reaches the newest table,
  // when the daemon refuses to grow (the index at its largest size, the cap
  // used up) or when a table cannot be mapped.
  for (;;) {
    Status s = GrowIndex(tables);
    // Full and Unavailable would end the batch and take the row's room
    // back (ChunkWriter::Publish, CacheImpl::PutBatch), which readers may
    // use: the row stays published where it is (a miss, recomputed from the
    // source), and the next row, which meets the same full table, gets the
    // answer.
    if (s.IsFull() || s.IsUnavailable()) return Status::OK();
    if (!s.ok()) return s;
    if (tables_->Republish(id, loc, &tables) == TableSet::Published::kInserted) {
      return Status::OK();
    }
  }
}

bool ChunkWriter::MoveUsed(Chunk* c, uint64_t to) {
  std::atomic<uint64_t>& mark = c->header->used;
  uint64_t seen = c->used;
  for (;;) {
    if (seen & layout::kRoomTaken) {
      // The daemon took the chunk's end back for another writer: the chunk
      // ends where it says, and the mark is this process's again (unless
      // the daemon took more meanwhile: then that is read).
      c->size = std::min(c->size, seen & ~layout::kRoomTaken);
      if (!mark.compare_exchange_strong(seen, c->used, std::memory_order_relaxed))
        continue;
      seen = c->used;
    } else if (seen != c->used) {
      // Only this process and the daemon write the mark: never write here
      // again.
      c->size = c->used;
      return false;
    }
    if (to > c->size) return false;
    if (mark.compare_exchange_strong(seen, to, std::memory_order_relaxed)) {
      c->used = to;
      return true;
    }
  }
}

void ChunkWriter::EncodeDeferred(const Chunk& c) {
  for (const Deferred& d : deferred_) {
    RowCodec::Encode(d.id, d.columns, reinterpret_cast<std::byte*>(c.base + d.off),
                     d.size);
  }
}

// Whether a write through a descriptor may reach `end` bytes into its file:
// a file size limit (ulimit -f) below that would make it SIGXFSZ, which
// kills a process that does not ignore it (one that does gets EFBIG), where
// a write through the mapping meets no such limit.
static bool WithinFileSizeLimit(uint64_t end) {
  rlimit limit;
  return getrlimit(RLIMIT_FSIZE, &limit) == 0 &&
         (limit.rlim_cur == RLIM_INFINITY || end <= limit.rlim_cur);
}

void ChunkWriter::WriteDeferred(Chunk* c, BatchLock* lock) {
  // Once a batch for each chunk (two system calls, lost in the noise of
  // put_fill_cpu's batches of 64 3 KB rows): what they check changes only
  // when the process's other code closes the descriptor or lowers its
  // limit, which may come between any two checks anyway.
  if (const uint64_t end = c->offset + c->size;
      lock->fd_checked_ != c->seg || lock->fd_checked_end_ < end) {
    // Other code of the process closed it (its number may be another
    // file's now), or its file size limit lies below the chunk's end:
    // through the mapping.
    if (!FdNamesSegment(*c->seg) || !WithinFileSizeLimit(end)) {
      c->fd = -1;
      EncodeDeferred(*c);
      return;
    }
    lock->fd_checked_ = c->seg;
    lock->fd_checked_end_ = end;
  }
  // The rows' heads (header and descriptors) are encoded here; their
  // columns' bytes go from the caller's buffers straight into the file.
  size_t head_bytes = 0;
  for (const Deferred& d : deferred_) head_bytes += RowCodec::HeadBytes(d.columns);
  heads_.resize(head_bytes);
  pieces_.clear();
  static constexpr std::byte kZeros[8] = {};
  std::byte* head = heads_.data();
  for (const Deferred& d : deferred_) {
    const size_t n = RowCodec::EncodeHead(d.id, d.columns, head, d.size);
    pieces_.push_back({head, n});
    head += n;
    for (const ColumnRef& col : d.columns) {
      if (col.nbytes > 0) pieces_.push_back({const_cast<void*>(col.data), col.nbytes});
      if (size_t pad = RowCodec::PaddedBytes(col.nbytes) - col.nbytes; pad > 0) {
        pieces_.push_back({const_cast<std::byte*>(kZeros), pad});
      }
    }
  }
  // The rows lie back to back from the first one's offset.
  auto pos = static_cast<off_t>(c->offset + deferred_.front().off);
  size_t next = 0;
  while (next < pieces_.size()) {
    const int count = static_cast<int>(std::min<size_t>(IOV_MAX, pieces_.size() - next));
    ssize_t n = pwritev(c->fd, &pieces_[next], count, pos);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The descriptor failed (it never does on tmpfs but for a bad column
      // pointer): write every row through the mapping instead.
      EncodeDeferred(*c);
      return;
    }
    pos += n;
    // Past the pieces written whole; a piece written in part is moved on.
    auto left = static_cast<size_t>(n);
    while (left > 0 && left >= pieces_[next].iov_len) left -= pieces_[next++].iov_len;
    if (left > 0) {
      pieces_[next].iov_base = static_cast<char*>(pieces_[next].iov_base) + left;
      pieces_[next].iov_len -= left;
    }
  }
}

bool ChunkWriter::Publish(BatchLock* lock, Tally* tally) {
  if (!lock->lock_.owns_lock()) return !lock->ended_;
  mu_.AssertHeld();
  if (deferred_.empty()) return !lock->ended_;
  Chunk& c = chunks_[deferred_node_];
  WriteDeferred(&c, lock);
  // The rows' bytes are in the file's pages, stored by this thread (the
  // kernel's copy, before pwritev returned): the index insert's release
  // orders them before the location, as it does a copy through the
  // mapping.
  for (size_t i = 0; i < deferred_.size(); ++i) {
    const Deferred& d = deferred_[i];
    bool added = false;
    Status s = Insert(d.id, d.size, d.off, &c, tally, &added);
    lock->statuses_[d.row] = s;
    if (lock->inserted_ != nullptr) lock->inserted_[d.row] = added;
    if (s.IsFull() || s.IsUnavailable()) {
      // Ends the batch here, as the row would have when written alone; the
      // later rows are not published and their room comes back.
      lock->ended_ = true;
      lock->ended_at_ = d.row;
      lock->ended_status_ = s;
      MoveUsed(&c, d.off);
      break;
    }
  }
  deferred_.clear();
  return !lock->ended_;
}

Status ChunkWriter::GrowIndex(uint32_t seen) {
  Status s = client_->Call(
      protocol::GrowIndexRequest{.cache_id = cache_id_, .seen_tables = seen});
  if (!s.ok()) return s;
  return tables_->MapNew();
}

void ChunkWriter::ReturnChunks() {
  ForkSafeLock lock(&mu_);
  closed_ = true;
  if (fork_gen_ != ForkGeneration()) return;  // the parent's chunks
  for (Chunk& c : chunks_) {
    if (c.base == nullptr) continue;
    // The daemon reclaims the tail on disconnect anyway; the wait for the
    // answer is short (protocol::kReturnChunkTimeoutMs), and a lost
    // connection is not reopened for it.
    client_
        ->CallOnCurrentConnection(protocol::ReturnChunkRequest{
            .cache_id = cache_id_, .seg_no = c.seg_no, .offset = c.offset})
        .PermitUncheckedError();
    c = Chunk{};
  }
}

}  // namespace shmcache
