// The row model of the Python package: the one place where a sample (a
// bare value, a tuple or a dict of arrays, tensors, numbers, bytes or PIL
// images) becomes stored columns and columns become a sample again. Hits
// (columns in shared memory) and misses (columns just encoded) are decoded
// by the same RowBuilder, so every epoch yields the same types.
//
// A column is (name, dtype name, array), in that order, everywhere.
// The shape of a row is carried by its column names:
//   "#"            one column: the sample is the bare value;
//   "#0", "#1"...  every name starts with '#': a tuple, in stored order;
//   anything else  a dict of name -> value.
// A PIL image column carries its mode after kTagSep ("#0\x1fRGB"): the
// array is np.asarray(image), decoded back with PIL.Image.fromarray. A
// Python int, float or bool (the builtin types, not a numpy scalar or a
// tensor) is a 0-d int64 / float64 / bool column tagged kNumberTag
// ("#1\x1fpy"), decoded by the torch leaf (CachedDataset's samples) as
// that Python number: a sample comes back with the types the dataset gave
// it (default_collate batches a number as it would the 0-d tensor); the
// numpy leaf (DatasetCache.get) gives its 0-d array, as for any number. A
// selection by name ("#0", "img") and read_into's targets
// (batch_reader.h) ignore the tag.
//
// Thread safety: every function here needs the GIL, except
// RowBuilder::Copy, which releases it itself for large copies.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clients/python/shmcache/release_gil.h"
#include "shmcache/batch_reader.h"
#include "shmcache/row.h"
#include "shmcache/types.h"

namespace shmcache::python {

namespace py = pybind11;

inline constexpr char kPos = '#';
inline constexpr char kTagSep = '\x1f';
inline constexpr std::string_view kNumberTag = kNumberSuffix.substr(1);

// The version of the columns Encode makes of a sample. It is part of the
// identity of a dataset's cache (shmcache.torch.fingerprint), so that rows
// stored by a package of another version, which decode to other types,
// are another cache's and never this one's hits. Raise it with any change
// to the columns Encode makes of some value. 1: numpy.float64 and
// complex128 stored as Python numbers (tagged); 2: as numpy scalars.
inline constexpr int kRowFormat = 2;

// numpy dtype <-> DType. bfloat16 and bytes have no numpy type of their
// own: they travel as uint16 / uint8 arrays with the name given.
// FromNumpy throws TypeError naming an unsupported dtype.
DType FromNumpy(const py::dtype& dt);
py::dtype ToNumpy(DType t);
// The torch dtype name a stored dtype reads into ("" for bytes, which have
// no torch type): torch 1.13 has no uint16/32/64, those widen to int32 /
// int64 (uint64 wraps above 2**63).
const char* TorchName(DType t);
// {dtype name: (itemsize, numpy dtype name, torch dtype name or None)}.
py::dict DTypeTable();

// How names shape a row (the rule above); "value", "tuple" or "dict".
enum class RowKind { kValue, kTuple, kDict };
RowKind KindOf(std::span<const std::string_view> keys);
const char* KindName(RowKind k);
// The key of a stored name (the tag removed) and its tag ("" for none).
std::string_view KeyOf(std::string_view stored);
std::string_view TagOf(std::string_view stored);

// sample -> [(name, dtype, array)]: C-contiguous arrays in native byte
// order. Arrays already so are used as they are (no copy). TypeError for a
// value that has no column type (a Python int outside int64 included:
// torch has no uint64 to give it back as), ValueError for a dict key that would be
// taken for a positional one. Protocol limits (columns per row, name
// bytes) are the cache's to check: a put refuses such a row.
py::list Encode(py::handle sample);
// [Encode(s) for s in samples] in one call: a call from Python costs a
// sample about as much as Encode itself (pybind11's dispatch).
py::list EncodeAll(const py::iterable& samples);

enum class Leaf { kNumpy, kTorch };

// Builds the Python objects of rows: objects are allocated with the GIL
// held and filled by Copy() after, without it for large rows.
class RowBuilder {
 public:
  // zero_copy: a column with a base (Build's) becomes an array over its
  // bytes that keeps the base alive: a read-only numpy array, or a tensor
  // (torch needs the writable flag; the memory of a hit is mapped
  // read-only). Otherwise a copy. Widened columns and PIL images always
  // copy.
  RowBuilder(Leaf leaf, bool zero_copy) : leaf_(leaf), zero_copy_(zero_copy) {}

  // The sample of `cols` (all, in order; bases[i] keeps cols[i] alive or
  // is null). single: the one column's value itself, whatever its name.
  py::object Build(std::span<const ColumnView> cols, std::span<const py::handle> bases,
                   bool single);

  // Fills what Build allocated. REQUIRES: the columns are still valid.
  void Copy() REQUIRES(g_gil);
  // Bytes of the columns handed out (a widened column counts its stored
  // bytes).
  uint64_t bytes() const { return bytes_; }

 private:
  struct PendingCopy {
    ColumnView src;
    DType out_type = DType::kUInt8;
    void* dst = nullptr;
    void Run() const;
  };
  void CopyNow();
  void Later(const ColumnView& c, DType out, void* dst);
  py::object Value(const ColumnView& c, py::handle base);

  Leaf leaf_;
  bool zero_copy_;
  // The copies Copy() makes: the first kInline without a heap allocation
  // (a small hit's row has a column or two; a vector's malloc and free
  // were a tenth of its cost besides torch).
  static constexpr size_t kInline = 4;
  PendingCopy inline_[kInline];
  size_t num_pending_ = 0;
  std::vector<PendingCopy> more_;
  size_t copy_bytes_ = 0;
  uint64_t bytes_ = 0;
};

// The columns of `row` named by `names` (their keys), in that order
// (KeyError naming one the row lacks), or all when names is null.
std::vector<ColumnView> SelectColumns(uint64_t id, const RowView& row,
                                      const std::vector<std::string>* names);

// Columns parsed from rows of [(name, dtype name or None, array)] (None:
// the array's own dtype): views over the arrays and the names' strings,
// which it keeps alive (with each column's tuple).
// TypeError / ValueError for a malformed column (not an array, a foreign
// byte order, an itemsize that is not the dtype's). The columns of every
// row are held in one run, so that a batch of rows costs a few
// allocations rather than five for each row (with the array conversion
// below, two thirds of put_batch's instructions for a row, callgrind).
class ParsedColumns {
 public:
  // Room for `rows` rows of `columns` columns in all, before AddRow.
  void Reserve(size_t rows, size_t columns);
  // Parses one more row's columns.
  void AddRow(const py::list& columns);
  size_t num_rows() const { return row_ends_.size(); }
  // The columns of row `r`, valid until the next AddRow.
  std::span<const ColumnView> row(size_t r) const {
    const size_t begin = r == 0 ? 0 : row_ends_[r - 1];
    return std::span(views_).subspan(begin, row_ends_[r] - begin);
  }
  // Every column's array, in the rows' order.
  const std::vector<py::array>& arrays() const { return arrays_; }

 private:
  std::vector<py::array> arrays_;
  std::vector<py::object> tuples_;  // every column's (name, dtype, array)
  std::vector<ColumnView> views_;
  std::vector<int64_t> dims_;     // every column's shape, one after the other
  std::vector<size_t> dims_at_;   // where each view's shape starts in dims_
  std::vector<size_t> row_ends_;  // the end of each row's views
};

// decode(columns, torch): the sample a hit of these columns would be.
py::object Decode(const py::list& columns, bool torch) REQUIRES(g_gil);

}  // namespace shmcache::python
