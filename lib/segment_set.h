// SegmentSet: the data segments of one cache as this process maps them,
// and the one checked reading of a row at an index location.
//
// A segment is mapped on first use (by a reader that meets a location in
// it, or by the writer leased a chunk of it) and stays mapped until the set
// is destroyed, so a view into it stays valid.
//
// Thread safety: Find, ReadRow, ReadRowIn, Prefetch and PrefetchRow from
// any thread without a lock; Map and Resolve take the set's own mutex
// (LockRank::kCacheSegments) when they map a file.
#pragma once

#include <cstdint>
#include <functional>

#include "format/instance.h"
#include "format/layout.h"
#include "format/row_codec.h"
#include "lib/fork_safety.h"
#include "lib/segment_map.h"
#include "shmcache/row.h"
#include "shmcache/status.h"

namespace shmcache {

class SegmentSet {
 public:
  // `paths` names the instance's files when a segment is mapped.
  SegmentSet(uint32_t cache_id, std::function<InstancePaths()> paths);
  SegmentSet(const SegmentSet&) = delete;
  SegmentSet& operator=(const SegmentSet&) = delete;

  // The mapping of segment seg_no, or nullptr when it is not mapped (yet).
  const MappedSegment* Find(uint32_t seg_no) const { return map_.Find(seg_no); }
  // The mapping of segment seg_no, mapped now when it was not. Corruption
  // when the file is not that segment of this cache; IOError when it cannot
  // be opened.
  Status Map(uint32_t seg_no, const MappedSegment** out) EXCLUDES(mu_);

  // What ReadRow found at a location.
  enum class RowCheck {
    kOk,
    kNotMapped,  // its segment is not mapped in this process yet
    kOutside,    // the offset is not a row's place in that segment
    kMismatch,   // the bytes there are not a row of that id
  };
  // The row of `id` at in-memory location `loc` (neither empty nor
  // spilled): viewed in *view (in_shared_memory), with its segment's NUMA
  // node in *node. These are the checks every read of a row in memory
  // makes, the hit path's and the others' (Resolve); inline, as the hit
  // path is (docs/hit-path.md). It maps nothing.
  [[gnu::always_inline]] RowCheck ReadRow(uint64_t id, uint64_t loc, RowView* view,
                                          int* node) const {
    const MappedSegment* seg = map_.Find(layout::LocationSegment(loc));
    if (seg == nullptr) return RowCheck::kNotMapped;
    return ReadRowIn(seg, id, loc, view, node);
  }
  // ReadRow in `seg`, the mapping of loc's segment that Find (or
  // PrefetchRow) returned: for a caller that found it already.
  [[gnu::always_inline]] static RowCheck ReadRowIn(const MappedSegment* seg, uint64_t id,
                                                   uint64_t loc, RowView* view,
                                                   int* node) {
    const uint64_t off = layout::LocationOffset(loc);
    if (off < layout::kSegmentHeaderSize || off >= seg->size || off % 8 != 0) {
      return RowCheck::kOutside;
    }
    if (!RowCodec::DecodeHeader(reinterpret_cast<const std::byte*>(seg->read_base + off),
                                seg->size - off, id, view)) {
      return RowCheck::kMismatch;
    }
    *node = seg->node;
    return RowCheck::kOk;
  }
  // ReadRow, mapping the segment first when it is not: Corruption saying
  // what did not match, or Map's error.
  Status Resolve(uint64_t id, uint64_t loc, RowView* view, int* node) EXCLUDES(mu_);
  // Starts loading the first line of the row at in-memory location `loc`
  // when its segment is mapped and the offset lies inside it.
  // Always inlined, as IndexTable::PrefetchSlot is (gcc may drop a call of
  // a function that only prefetches).
  [[gnu::always_inline]] void Prefetch(uint64_t loc) const { PrefetchRow(loc); }
  // Prefetch, returning the segment's mapping (nullptr: not mapped yet) for
  // ReadRowIn.
  [[gnu::always_inline]] const MappedSegment* PrefetchRow(uint64_t loc) const {
    const MappedSegment* seg = map_.Find(layout::LocationSegment(loc));
    if (seg != nullptr) {
      const uint64_t off = layout::LocationOffset(loc);
      if (off < seg->size) __builtin_prefetch(seg->read_base + off);
    }
    return seg;
  }

 private:
  const uint32_t cache_id_;
  const std::function<InstancePaths()> paths_;
  ForkSafeMutex mu_{LockRank::kCacheSegments};
  SegmentMap map_;  // Insert() with mu_ held
};

}  // namespace shmcache
