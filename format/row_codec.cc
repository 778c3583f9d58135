#include "format/row_codec.h"

#include <cstring>
#include <string>

namespace shmcache {
namespace {

constexpr size_t kDescFixed = 8;

size_t Pad8(size_t n) { return (n + 7) & ~size_t{7}; }

size_t DescBytes(size_t ndim, size_t name_len) {
  return kDescFixed + ndim * 8 + Pad8(name_len);
}

// itemsize * product(shape), false on a negative dim or overflow. On the
// hit path: no division.
bool ShapeBytes(DType t, const int64_t* shape, size_t ndim, size_t* out) {
  size_t n = DTypeSize(t);
  if (n == 0) return false;
  for (size_t i = 0; i < ndim; ++i) {
    int64_t d;
    std::memcpy(&d, shape + i, sizeof d);
    if (d < 0 || __builtin_mul_overflow(n, static_cast<size_t>(d), &n)) return false;
  }
  if (n > kMaxRowBytes) return false;
  *out = n;
  return true;
}

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void Store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

struct Desc {
  DType dtype;
  size_t ndim;
  std::string_view name;
  uint32_t data_offset;
  const int64_t* shape;
  size_t nbytes;
  size_t desc_bytes;
};

// Reads the descriptor at `off` of a row of `total` bytes. False when it
// does not lie wholly inside the row: the accessors below check every
// descriptor they read, so a row that skipped full validation (the hit path
// decodes only the header) can never make them read out of bounds.
bool ReadDesc(const std::byte* row, size_t off, size_t total, Desc* d) {
  if (off + kDescFixed > total) return false;
  const std::byte* p = row + off;
  d->dtype = static_cast<DType>(Load<uint8_t>(p));
  d->ndim = Load<uint8_t>(p + 1);
  size_t name_len = Load<uint8_t>(p + 2);
  d->desc_bytes = DescBytes(d->ndim, name_len);
  if (off + d->desc_bytes > total) return false;
  d->data_offset = Load<uint32_t>(p + 4);
  d->shape = reinterpret_cast<const int64_t*>(p + kDescFixed);
  d->name = std::string_view(reinterpret_cast<const char*>(p + kDescFixed + d->ndim * 8),
                             name_len);
  d->nbytes = 0;
  return ShapeBytes(d->dtype, d->shape, d->ndim, &d->nbytes) && d->data_offset % 8 == 0 &&
         d->data_offset <= total && d->nbytes <= total - d->data_offset;
}

ColumnView ToView(const std::byte* row, const Desc& d) {
  return ColumnView{d.name, d.dtype, std::span<const int64_t>(d.shape, d.ndim),
                    row + d.data_offset, d.nbytes};
}

}  // namespace

Status RowCodec::EncodedSize(std::span<const ColumnRef> columns, size_t* size) {
  if (columns.empty()) return Status::InvalidArgument("a row needs a column");
  if (columns.size() > kMaxColumns) {
    return Status::InvalidArgument("too many columns (max 1024)");
  }
  size_t total = kRowHeaderBytes;
  for (const ColumnRef& c : columns) {
    if (c.name.size() > 255) {
      return Status::InvalidArgument("column name longer than 255 bytes");
    }
    if (c.shape.size() > 255) {
      return Status::InvalidArgument("column '" + std::string(c.name) +
                                     "' has more than 255 dimensions");
    }
    size_t expect;
    if (!ShapeBytes(c.dtype, c.shape.data(), c.shape.size(), &expect)) {
      return Status::InvalidArgument("column '" + std::string(c.name) +
                                     "' has a bad dtype or shape");
    }
    if (expect != c.nbytes) {
      return Status::InvalidArgument(
          "column '" + std::string(c.name) + "' has " + std::to_string(c.nbytes) +
          " bytes but its dtype and shape need " + std::to_string(expect));
    }
    if (c.nbytes > 0 && c.data == nullptr) {
      return Status::InvalidArgument("column '" + std::string(c.name) +
                                     "' has no data pointer");
    }
    total += DescBytes(c.shape.size(), c.name.size()) + Pad8(c.nbytes);
    if (total > kMaxRowBytes) {
      return Status::InvalidArgument("row larger than 4 GB");
    }
  }
  *size = total;
  return Status::OK();
}

size_t RowCodec::HeadBytes(std::span<const ColumnRef> columns) {
  size_t head = kRowHeaderBytes;
  for (const ColumnRef& c : columns) head += DescBytes(c.shape.size(), c.name.size());
  return head;
}

size_t RowCodec::PaddedBytes(size_t nbytes) { return Pad8(nbytes); }

size_t RowCodec::EncodeHead(uint64_t key, std::span<const ColumnRef> columns,
                            std::byte* dst, size_t size) {
  Store<uint32_t>(dst, static_cast<uint32_t>(size));
  Store<uint16_t>(dst + 4, static_cast<uint16_t>(columns.size()));
  Store<uint8_t>(dst + 6, kRowVersion);
  Store<uint8_t>(dst + 7, 0);
  Store<uint64_t>(dst + 8, key);
  size_t desc = kRowHeaderBytes;
  size_t data = HeadBytes(columns);
  for (const ColumnRef& c : columns) {
    std::byte* p = dst + desc;
    Store<uint8_t>(p, static_cast<uint8_t>(c.dtype));
    Store<uint8_t>(p + 1, static_cast<uint8_t>(c.shape.size()));
    Store<uint8_t>(p + 2, static_cast<uint8_t>(c.name.size()));
    Store<uint8_t>(p + 3, 0);
    Store<uint32_t>(p + 4, static_cast<uint32_t>(data));
    // A scalar's shape and an empty name may have null data: memcpy of
    // null is undefined even for 0 bytes.
    if (!c.shape.empty()) std::memcpy(p + kDescFixed, c.shape.data(), c.shape.size() * 8);
    std::byte* name = p + kDescFixed + c.shape.size() * 8;
    if (!c.name.empty()) std::memcpy(name, c.name.data(), c.name.size());
    std::memset(name + c.name.size(), 0, Pad8(c.name.size()) - c.name.size());
    desc += DescBytes(c.shape.size(), c.name.size());
    data += Pad8(c.nbytes);
  }
  return desc;
}

void RowCodec::Encode(uint64_t key, std::span<const ColumnRef> columns, std::byte* dst,
                      size_t size) {
  size_t data = EncodeHead(key, columns, dst, size);
  for (const ColumnRef& c : columns) {
    if (c.nbytes) std::memcpy(dst + data, c.data, c.nbytes);
    std::memset(dst + data + c.nbytes, 0, Pad8(c.nbytes) - c.nbytes);
    data += Pad8(c.nbytes);
  }
}

uint64_t RowCodec::KeyOf(const RowView& v) { return Load<uint64_t>(v.bytes_.data() + 8); }

bool RowCodec::IsRowOf(const std::byte* p, size_t n, uint64_t key) {
  RowView view;
  return Decode(p, n, &view).ok() && view.encoded().size() == n && KeyOf(view) == key;
}

Status RowCodec::Decode(const std::byte* p, size_t max_bytes, RowView* out) {
  if (max_bytes < kRowHeaderBytes) return Status::Corruption("row truncated");
  uint32_t total = Load<uint32_t>(p);
  uint16_t ncols = Load<uint16_t>(p + 4);
  if (total < kRowHeaderBytes || total > max_bytes || total % 8 != 0) {
    return Status::Corruption("row size field out of bounds");
  }
  if (Load<uint8_t>(p + 6) != kRowVersion) {
    return Status::Corruption("row format version differs");
  }
  if (ncols == 0 || ncols > kMaxColumns) {
    return Status::Corruption("row column count out of bounds");
  }
  size_t desc = kRowHeaderBytes;
  for (size_t i = 0; i < ncols; ++i) {
    if (desc + kDescFixed > total) return Status::Corruption("descriptor truncated");
    size_t ndim = Load<uint8_t>(p + desc + 1);
    size_t name_len = Load<uint8_t>(p + desc + 2);
    size_t db = DescBytes(ndim, name_len);
    if (desc + db > total) return Status::Corruption("descriptor truncated");
    size_t nbytes;
    auto dtype = static_cast<DType>(Load<uint8_t>(p + desc));
    if (!ShapeBytes(dtype, reinterpret_cast<const int64_t*>(p + desc + kDescFixed), ndim,
                    &nbytes)) {
      return Status::Corruption("column dtype or shape invalid");
    }
    uint32_t off = Load<uint32_t>(p + desc + 4);
    if (off % 8 != 0 || off > total || nbytes > total - off) {
      return Status::Corruption("column data out of bounds");
    }
    desc += db;
  }
  out->bytes_ = std::span<const std::byte>(p, total);
  out->num_columns_ = ncols;
  out->in_shared_memory_ = false;  // DecodeHeader views shared memory
  return Status::OK();
}

Status RowCodec::Adopt(Row* out, size_t bytes) {
  return Decode(reinterpret_cast<const std::byte*>(out->buf_.data()), bytes, &out->view_);
}

Status RowCodec::Project(const RowView& in, std::span<const std::string_view> names,
                         Row* out) {
  // Gather the selected columns as ColumnRefs over the source bytes, then
  // encode them: only the selected data is copied.
  ColumnRef stack_refs[16];
  std::vector<ColumnRef> heap_refs;
  ColumnRef* refs = stack_refs;
  if (names.size() > 16) {
    heap_refs.resize(names.size());
    refs = heap_refs.data();
  }
  for (size_t i = 0; i < names.size(); ++i) {
    std::optional<ColumnView> c = in.find(names[i]);
    if (!c) {
      return Status::ColumnNotFound("row " + std::to_string(KeyOf(in)) +
                                    " has no column '" + std::string(names[i]) + "'");
    }
    refs[i] = ColumnRef{c->name, c->dtype, c->shape, c->data, c->nbytes};
  }
  std::span<const ColumnRef> cols(refs, names.size());
  size_t size = 0;
  Status s = EncodedSize(cols, &size);
  if (!s.ok()) return s;
  std::byte* dst = Reserve(out, size);
  Encode(KeyOf(in), cols, dst, size);
  out->view_.bytes_ = std::span<const std::byte>(dst, size);
  out->view_.num_columns_ = names.size();
  return Status::OK();
}

// ---- RowView ----------------------------------------------------------

ColumnView RowView::column(size_t i) const {
  const std::byte* p = bytes_.data();
  size_t off = kRowHeaderBytes;
  Desc d;
  for (size_t k = 0; k <= i && k < num_columns_; ++k) {
    if (!ReadDesc(p, off, bytes_.size(), &d)) return ColumnView{};
    if (k == i) return ToView(p, d);
    off += d.desc_bytes;
  }
  return ColumnView{};
}

std::optional<ColumnView> RowView::find(std::string_view name) const {
  const std::byte* p = bytes_.data();
  size_t off = kRowHeaderBytes;
  Desc d;
  for (size_t k = 0; k < num_columns_; ++k) {
    if (!ReadDesc(p, off, bytes_.size(), &d)) return std::nullopt;
    if (d.name == name) return ToView(p, d);
    off += d.desc_bytes;
  }
  return std::nullopt;
}

}  // namespace shmcache
