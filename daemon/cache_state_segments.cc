// A cache's data segments: their sizes, their files (named, created,
// formatted), and the jobs that make the next one ahead of need.
#include "cache_state.h"

#include <algorithm>

#include "logger.h"

namespace shmcache {

namespace {
// Names tried before giving up when another user took them: segment
// numbers are skipped in order, and the next call goes on past them.
constexpr uint32_t kSegmentNameTries = 1024;
}  // namespace

uint64_t CacheState::NextSegmentSize(uint64_t min_bytes,
                                     const MemoryAccount& account) const {
  // Grow by a quarter of what the cache holds: few segments for big caches,
  // and at most ~25% reserved but unused at the end.
  uint64_t want =
      std::clamp<uint64_t>(AlignUp(data_bytes_ / 4, 1 << 20), layout::kMinSegmentBytes,
                           layout::kMaxSegmentBytes);
  want = std::max(want, min_bytes);
  // Whole 2 MB pages where possible, so that huge pages can back it.
  if (want >= (4u << 20)) want = AlignUp(want, 2u << 20);
  want = std::min({want, BudgetLeft(), account.available()});
  want = want / 4096 * 4096;
  return want >= min_bytes ? want : 0;
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

void CacheState::FormatSegment(ShmFile* f, uint32_t cache_id, uint32_t seg_no, int node,
                               uint64_t size) {
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
  segments_.emplace(
      seg_no, Segment{seg_no, node, size, layout::kSegmentHeaderSize, std::move(file)});
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

std::optional<SegmentJob> CacheState::TakeSegmentJob(int node, MemoryAccount* account) {
  size_t n = static_cast<size_t>(node);
  if (destroyed_ || preparing_[n] || prepared_[n] || current_[n] < 0) {
    return std::nullopt;
  }
  const Segment& cur = segments_.at(static_cast<uint32_t>(current_[n]));
  if (cur.size - cur.carved > cur.size / 2) return std::nullopt;
  uint64_t size = NextSegmentSize(layout::kMinSegmentBytes, *account);
  if (size == 0 || next_seg_no_ > layout::kMaxSegmentId) return std::nullopt;
  // Reserved now, so that budgets and the cap hold while the file is made.
  account->Reserve(size);
  data_bytes_ += size;
  AddReserved(size);
  preparing_[n] = true;
  return SegmentJob{cache_id_, next_seg_no_++, node, size};
}

void CacheState::FinishSegmentJob(const SegmentJob& job, const Status& made, ShmFile file,
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
    if (log_)
      log_->Warn("cache {}: preparing a segment failed: {}", cache_id_, made.message());
    return;
  }
  prepared_[n] = Prepared{job.seg_no, job.size, std::move(file)};
}

}  // namespace shmcache
