#include "lib/segment_set.h"

#include <unistd.h>

#include <string>
#include <utility>

#include <fmt/format.h>

#include "format/shm_file.h"

namespace shmcache {

SegmentSet::SegmentSet(uint32_t cache_id, std::function<InstancePaths()> paths)
    : cache_id_(cache_id), paths_(std::move(paths)) {}

Status SegmentSet::Map(uint32_t seg_no, const MappedSegment** out) {
  if (const MappedSegment* m = map_.Find(seg_no)) {
    *out = m;
    return Status::OK();
  }
  ForkSafeLock lock(&mu_);
  if (const MappedSegment* m = map_.Find(seg_no)) {
    *out = m;
    return Status::OK();
  }
  std::string path = paths_().SegmentFile(cache_id_, seg_no);
  ShmFile f, read_only;
  int fd = -1;
  Status s = ShmFile::Open(path, &f, &read_only, &fd);
  if (!s.ok()) return s;
  if (const char* bad = layout::CheckSegmentFile(f.data(), f.size(), cache_id_, seg_no)) {
    if (fd >= 0) close(fd);
    return Status::Corruption(path + ": " + bad);
  }
  int node = static_cast<int>(reinterpret_cast<layout::SegmentHeader*>(f.data())->node);
  *out = map_.Insert(seg_no, std::move(f), std::move(read_only), node, fd);
  return *out ? Status::OK() : Status::Corruption("segment number out of range");
}

Status SegmentSet::Resolve(uint64_t id, uint64_t loc, RowView* view, int* node) {
  RowCheck r = ReadRow(id, loc, view, node);
  if (r == RowCheck::kNotMapped) {
    const MappedSegment* seg;
    Status s = Map(layout::LocationSegment(loc), &seg);
    if (!s.ok()) return s;
    r = ReadRow(id, loc, view, node);
  }
  switch (r) {
    case RowCheck::kOk: return Status::OK();
    case RowCheck::kOutside:
    case RowCheck::kNotMapped:  // mapped above: only an out-of-range number
      return Status::Corruption("index entry points outside its segment");
    case RowCheck::kMismatch: break;
  }
  return Status::Corruption(
      fmt::format("index entry for row {} points at a row that does not match", id));
}

}  // namespace shmcache
