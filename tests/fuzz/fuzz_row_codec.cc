// Fuzz target: RowCodec::Decode on arbitrary bytes (as found in a segment,
// the spill store or a frame), then every accessor on what it accepted.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "format/row_codec.h"

using namespace shmcache;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Rows in shared memory are 8-byte aligned; so is this copy.
  std::vector<uint64_t> buf((size + 7) / 8);
  if (size) std::memcpy(buf.data(), data, size);
  auto* p = reinterpret_cast<const std::byte*>(buf.data());
  RowView v;
  if (!RowCodec::Decode(p, size, &v).ok()) return 0;
  if (v.encoded().size() > size || v.num_columns() == 0) std::abort();
  uint64_t sink = RowCodec::KeyOf(v);
  std::vector<std::string_view> names;
  std::vector<ColumnRef> refs;
  for (size_t i = 0; i < v.num_columns(); ++i) {
    ColumnView c = v.column(i);
    // Every byte a view hands out lies inside the row.
    auto lo = v.encoded().data(), hi = lo + v.encoded().size();
    if (c.nbytes && (c.data < lo || c.data + c.nbytes > hi)) std::abort();
    for (size_t k = 0; k < c.nbytes; ++k) sink += static_cast<uint8_t>(c.data[k]);
    for (int64_t d : c.shape) sink += static_cast<uint64_t>(d);
    if (!v.find(c.name)) std::abort();
    names.push_back(c.name);
    refs.push_back(ColumnRef{c.name, c.dtype, c.shape, c.data, c.nbytes});
  }
  Row copy;
  RowCodec::Copy(v, &copy);
  if (copy.num_columns() != v.num_columns()) std::abort();
  Row proj;
  if (RowCodec::Project(v, std::span(names.data(), std::min<size_t>(names.size(), 3)),
                        &proj)
          .ok()) {
    RowView again;
    if (!RowCodec::Decode(proj.view().encoded().data(), proj.view().encoded().size(),
                          &again)
             .ok()) {
      std::abort();
    }
  }
  // What Decode accepts, Encode reproduces as a valid row.
  size_t n = 0;
  if (RowCodec::EncodedSize(refs, &n).ok()) {
    std::vector<uint64_t> out((n + 7) / 8);
    auto* o = reinterpret_cast<std::byte*>(out.data());
    RowCodec::Encode(RowCodec::KeyOf(v), refs, o, n);
    RowView round;
    if (!RowCodec::Decode(o, n, &round).ok() || round.num_columns() != v.num_columns()) {
      std::abort();
    }
  }
  asm volatile("" : : "r"(sink));
  return 0;
}
