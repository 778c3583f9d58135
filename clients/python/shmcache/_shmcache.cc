// _shmcache: the pybind11 binding of libshmcache, used by the `shmcache`
// Python package (see __init__.py for the user-facing API).
//
// Rows cross the boundary two ways: read / read_batch return them finished
// (a bare value, tuple or dict of numpy arrays or torch tensors, as put
// stored them), and get / get_batch as lists of (name, dtype_name, array)
// triples. Hits can be zero-copy: the arrays then point into shared memory
// (which this process maps read-only), are read-only numpy arrays, and hold
// a reference that keeps the Cache (and so its mappings) alive. The GIL is
// released around every call into the library that may wait (the daemon,
// large copies); a hit in memory is read with it held.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <bit>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shmcache/batch_reader.h"
#include "shmcache/cache.h"
#include "shmcache/client.h"

namespace py = pybind11;
using shmcache::Cache;
using shmcache::Client;
using shmcache::ColumnRef;
using shmcache::ColumnView;
using shmcache::DType;
using shmcache::Status;

namespace {

// Tags of the Python exception types (py::register_exception wants one
// C++ type each); errors are raised through g_error_types.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct NotFoundError : Error {};
struct UnavailableError : Error {};
struct FullError : Error {};
struct FingerprintMismatchError : Error {};
struct InvalidArgumentError : Error {};
struct NotSupportedError : Error {};
struct TooLargeError : Error {};
struct AlreadyExistsError : Error {};
struct PermissionDeniedError : Error {};

// The Python exception type of each Status code (Error for codes Python
// does not tell apart), filled when the module is imported. The module
// holds the types, so plain handles suffice.
py::handle g_error_types[static_cast<size_t>(Status::Code::kTooLarge) + 1];

py::handle ErrorType(const Status& s) {
  py::handle t = g_error_types[static_cast<size_t>(s.code())];
  return t ? t : g_error_types[0];
}

// The exception `s` raises, as an object: a batch reports a row's failure
// with it rather than raising.
py::object ExceptionOf(const Status& s) {
  return ErrorType(s)(s.ToString());
}

[[noreturn]] void Throw(const Status& s) {
  PyErr_SetString(ErrorType(s).ptr(), s.ToString().c_str());
  throw py::error_already_set();
}

void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

// numpy dtype <-> DType. bfloat16 and bytes have no numpy type of their
// own: they travel as uint16 / uint8 arrays with the name given explicitly.
DType FromNumpy(const py::dtype& dt) {
  char kind = dt.kind();
  size_t size = static_cast<size_t>(dt.itemsize());
  switch (kind) {
    case 'b':
      return DType::kBool;
    case 'u':
      if (size == 1) return DType::kUInt8;
      if (size == 2) return DType::kUInt16;
      if (size == 4) return DType::kUInt32;
      if (size == 8) return DType::kUInt64;
      break;
    case 'i':
      if (size == 1) return DType::kInt8;
      if (size == 2) return DType::kInt16;
      if (size == 4) return DType::kInt32;
      if (size == 8) return DType::kInt64;
      break;
    case 'f':
      if (size == 2) return DType::kFloat16;
      if (size == 4) return DType::kFloat32;
      if (size == 8) return DType::kFloat64;
      break;
    default:
      break;
  }
  throw py::type_error("unsupported array dtype: " +
                       py::str(static_cast<py::object>(dt)).cast<std::string>());
}

py::dtype MakeNumpyType(DType t) {
  switch (t) {
    case DType::kUInt8: return py::dtype("uint8");
    case DType::kInt8: return py::dtype("int8");
    case DType::kUInt16: return py::dtype("uint16");
    case DType::kInt16: return py::dtype("int16");
    case DType::kUInt32: return py::dtype("uint32");
    case DType::kInt32: return py::dtype("int32");
    case DType::kUInt64: return py::dtype("uint64");
    case DType::kInt64: return py::dtype("int64");
    case DType::kFloat16: return py::dtype("float16");
    case DType::kBFloat16: return py::dtype("uint16");
    case DType::kFloat32: return py::dtype("float32");
    case DType::kFloat64: return py::dtype("float64");
    case DType::kBool: return py::dtype("bool");
    case DType::kBytes: return py::dtype("uint8");
  }
  throw Error("row holds an unknown dtype");
}

// The numpy dtype of a column. Built once per type: parsing a dtype name
// costs more than the rest of a small hit. (Leaked: never released after
// the interpreter is gone.)
py::dtype ToNumpy(DType t) {
  static auto* types = [] {
    auto* v = new std::vector<py::dtype>;
    for (int i = 0; i < shmcache::kNumDTypes; ++i) {
      v->push_back(MakeNumpyType(static_cast<DType>(i)));
    }
    return v;
  }();
  auto i = static_cast<size_t>(t);
  if (i >= types->size()) throw Error("row holds an unknown dtype");
  return (*types)[i];
}

void MakeReadOnly(py::array& a) {
  py::detail::array_proxy(a.ptr())->flags &=
      ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
}

// An array over `c`'s bytes. With `base` it is a view that keeps `base`
// alive (read-only unless `writable`); without, a private writable copy.
py::array ColumnToArray(const ColumnView& c, py::handle base,
                        bool writable = false) {
  py::dtype dt = ToNumpy(c.dtype);
  std::vector<py::ssize_t> shape(c.shape.begin(), c.shape.end());
  if (base) {
    py::array a(dt, shape, {}, c.data, base);
    if (!writable) MakeReadOnly(a);
    return a;
  }
  py::array a(dt, shape);
  if (c.nbytes) std::memcpy(a.mutable_data(), c.data, c.nbytes);
  return a;
}

py::tuple ColumnTuple(const ColumnView& c, py::handle base,
                      bool writable = false) {
  return py::make_tuple(py::str(c.name.data(), c.name.size()),
                        shmcache::DTypeName(c.dtype),
                        ColumnToArray(c, base, writable));
}

py::dict StatsDict(const shmcache::CacheStats& st) {
  py::dict d;
  d["session_id"] = st.session_id;
  d["cache_id"] = st.cache_id;
  d["name"] = st.name;
  d["mem_rows"] = st.mem_rows;
  d["mem_bytes"] = st.mem_bytes;
  d["disk_rows"] = st.disk_rows;
  d["disk_bytes"] = st.disk_bytes;
  d["puts_full"] = st.puts_full;
  d["spill_reads"] = st.spill_reads;
  d["hits"] = st.hits;
  d["misses"] = st.misses;
  d["numa_hits"] = st.numa_hits;
  d["reserved_bytes"] = st.reserved_bytes;
  d["budget_bytes"] = st.budget_bytes;
  d["avg_row_bytes"] = st.avg_row_bytes();
  d["full"] = st.full;
  d["spilling"] = st.spilling;
  return d;
}

// The Python-side cache object. Shared ownership so that views can keep it
// alive after the Python object is gone.
struct PyCache {
  std::unique_ptr<Cache> cache;
  // BatchReaders not in use, guarded by the GIL: a caller takes one (or
  // makes one) and gives it back, so concurrent read_into calls never share
  // one, and fork() (which holds the GIL) never finds the list half-changed.
  // Declared after `cache`: destroyed (threads joined) before it.
  std::vector<std::unique_ptr<shmcache::BatchReader>> idle_readers;
  // Bytes of the columns read() and read_batch() handed out.
  uint64_t bytes_read = 0;
};
using PyCachePtr = std::shared_ptr<PyCache>;

// Capsule holding a reference to the cache, for zero-copy arrays' base.
py::capsule KeepAlive(const PyCachePtr& c) {
  auto* holder = new PyCachePtr(c);
  return py::capsule(holder, [](void* p) { delete static_cast<PyCachePtr*>(p); });
}

// dtype.isnative without a Python attribute lookup (this is per column of
// every put).
bool IsNative(const py::dtype& dt) {
  constexpr char kNative = std::endian::native == std::endian::little ? '<' : '>';
  char b = dt.byteorder();
  return b == '=' || b == '|' || b == kNative;
}

// One row to put: the ColumnRefs over the arrays of a Python column list,
// and what keeps them valid. Built in place and never moved: `refs` point
// into `names` and `shapes`.
struct PutRow {
  std::vector<py::array> keep;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<ColumnRef> refs;
};

// Fills *row from [(name, array, dtype_name_or_None), ...]; raises on a
// malformed column.
void ParseColumns(const py::list& columns, PutRow* row) {
  size_t n = columns.size();
  row->refs.resize(n);
  row->keep.reserve(n);
  row->names.reserve(n);
  row->shapes.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    py::tuple t = columns[i].cast<py::tuple>();
    if (t.size() != 3) throw py::value_error("a column is (name, array, dtype)");
    const std::string& name = row->names.emplace_back(t[0].cast<std::string>());
    py::array a = py::array::ensure(t[1], py::array::c_style);
    if (!a) throw py::type_error("column '" + name + "' is not an array");
    // Rows hold native values: a foreign byte order would read back as
    // other numbers.
    if (!IsNative(a.dtype())) {
      throw py::value_error("column '" + name +
                            "': the array is not in native byte order; convert "
                            "it first (a.astype(a.dtype.newbyteorder('=')))");
    }
    row->keep.push_back(a);
    DType dt;
    if (t[2].is_none()) {
      dt = FromNumpy(a.dtype());
    } else if (!shmcache::DTypeFromName(t[2].cast<std::string>(), &dt)) {
      throw py::value_error("unknown dtype name: " + t[2].cast<std::string>());
    }
    const auto& shape = row->shapes.emplace_back(a.shape(), a.shape() + a.ndim());
    if (shmcache::DTypeSize(dt) != static_cast<size_t>(a.itemsize())) {
      throw py::value_error("column '" + name +
                            "': array itemsize does not match its dtype");
    }
    row->refs[i] = ColumnRef{name, dt, shape, a.data(),
                             static_cast<size_t>(a.nbytes())};
  }
}

// put(id, [(name, array, dtype_name_or_None), ...]) -> inserted
bool Put(PyCache& self, uint64_t id, const py::list& columns) {
  PutRow row;
  ParseColumns(columns, &row);
  bool inserted = false;
  Status s;
  {
    py::gil_scoped_release nogil;
    s = self.cache->Put(id, row.refs, &inserted);
  }
  Check(s);
  return inserted;
}

// put_batch(ids, [columns, ...]) -> ([inserted per row], [(index, error)]):
// a row that failed is False in the first list and has in the second the
// exception put would have raised for it (an object, not raised). The
// rows are copied into shared memory without the GIL; the arrays stay
// alive meanwhile (PutRow::keep).
py::tuple PutBatch(PyCache& self, const std::vector<uint64_t>& ids,
                   const py::list& rows) {
  if (rows.size() != ids.size()) {
    throw py::value_error("put_batch: " + std::to_string(ids.size()) +
                          " ids but " + std::to_string(rows.size()) + " rows");
  }
  std::vector<PutRow> parsed(ids.size());
  std::vector<std::span<const ColumnRef>> refs(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ParseColumns(rows[i].cast<py::list>(), &parsed[i]);
    refs[i] = parsed[i].refs;
  }
  std::vector<Status> statuses(ids.size());
  std::unique_ptr<bool[]> inserted(new bool[ids.size()]);
  {
    py::gil_scoped_release nogil;
    self.cache->PutBatch(ids, refs, statuses, std::span(inserted.get(), ids.size()))
        .PermitUncheckedError();  // in every statuses[i] too
  }
  py::list out(ids.size());
  py::list errors;
  for (size_t i = 0; i < ids.size(); ++i) {
    out[i] = py::bool_(statuses[i].ok() && inserted[i]);
    if (!statuses[i].ok()) errors.append(py::make_tuple(i, ExceptionOf(statuses[i])));
  }
  return py::make_tuple(out, errors);
}

// A private copy of a row (Cache::Get's Row), owned by the arrays over it:
// copy-out costs one copy, from shared memory into the Row.
py::capsule OwnRow(shmcache::Row&& row) {
  auto* holder = new shmcache::Row(std::move(row));
  return py::capsule(holder, [](void* p) { delete static_cast<shmcache::Row*>(p); });
}

// [(name, dtype, array)] over a private Row (writable arrays, no copy).
py::list RowColumns(shmcache::Row&& row) {
  py::list out;
  if (row.num_columns() == 0) return out;
  py::capsule base = OwnRow(std::move(row));
  const auto* keep = static_cast<const shmcache::Row*>(base.get_pointer());
  for (size_t i = 0; i < keep->num_columns(); ++i) {
    out.append(ColumnTuple(keep->column(i), base, /*writable=*/true));
  }
  return out;
}

// The columns of `view` (all, or the named ones in that order), as
// zero-copy arrays over shared memory, or as copies when the view might
// point into the per-thread spill buffer.
py::list ViewColumns(const PyCachePtr& self, uint64_t id,
                     const shmcache::RowView& view,
                     const std::optional<std::vector<std::string>>& columns,
                     bool readonly) {
  // A spilled row's view points into a per-thread buffer that the next view
  // of a spilled row overwrites: such rows are copied, never viewed.
  bool zero_copy = view.in_shared_memory();
  py::object base = zero_copy ? py::object(KeepAlive(self)) : py::object();
  py::list out;
  if (columns) {
    for (const std::string& name : *columns) {
      std::optional<ColumnView> c = view.find(name);
      if (!c) throw py::key_error("row " + std::to_string(id) + " has no column '" + name + "'");
      out.append(ColumnTuple(*c, base, !readonly));
    }
  } else {
    for (size_t i = 0; i < view.num_columns(); ++i) {
      out.append(ColumnTuple(view.column(i), base, !readonly));
    }
  }
  return out;
}

// get(id, columns=None, copy=True, readonly=True)
//   -> [(name, dtype, array)] or None.
// copy=False: zero-copy arrays over shared memory, read-only unless
// readonly=False (for callers that wrap them in tensors and never write).
py::object Get(const PyCachePtr& self, uint64_t id,
               std::optional<std::vector<std::string>> columns, bool copy,
               bool readonly) {
  if (copy) {
    shmcache::Row row;
    Status s;
    {
      py::gil_scoped_release nogil;
      if (columns) {
        std::vector<std::string_view> names(columns->begin(), columns->end());
        s = self->cache->Get(id, names, &row);
      } else {
        s = self->cache->Get(id, &row);
      }
    }
    // A missing column of a present row is the caller's mistake.
    if (s.IsColumnNotFound()) throw py::key_error(s.message());
    if (s.IsNotFound()) return py::none();
    Check(s);
    return RowColumns(std::move(row));
  }
  shmcache::RowView view;
  Status s;
  {
    py::gil_scoped_release nogil;
    s = self->cache->View(id, &view);
  }
  if (s.IsNotFound()) return py::none();
  Check(s);
  return ViewColumns(self, id, view, columns, readonly);
}

// get_batch(ids, copy=True, readonly=True) -> [columns or None per id].
// copy=True uses Cache::GetBatch: spilled rows come from the daemon in one
// round trip per batch. copy=False views rows in shared memory; spilled
// rows are then copied one by one.
py::list GetBatch(const PyCachePtr& self, const std::vector<uint64_t>& ids,
                  bool copy, bool readonly) {
  py::list out;
  if (copy) {
    std::vector<shmcache::Row> rows(ids.size());
    std::vector<Status> statuses(ids.size());
    Status s;
    {
      py::gil_scoped_release nogil;
      s = self->cache->GetBatch(ids, rows, statuses);
    }
    Check(s);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (statuses[i].IsNotFound()) {
        out.append(py::none());
        continue;
      }
      Check(statuses[i]);
      out.append(RowColumns(std::move(rows[i])));
    }
    return out;
  }
  for (uint64_t id : ids) out.append(Get(self, id, std::nullopt, false, readonly));
  return out;
}

// ---- rows as finished Python objects --------------------------------------
//
// read() / read_batch() return what DatasetCache.get / CachedDataset hand
// out: a bare value, a tuple ("#0", "#1", ... columns) or a dict, of numpy
// arrays or torch tensors, bytes columns as bytes, built here rather than in
// Python.

enum class Leaf { kNumpy, kTorch };

// Copies smaller than this are made with the GIL held: releasing and taking
// it back costs about as much as copying a few KB, and no other thread can
// get anything done in that time.
constexpr size_t kReleaseGilBytes = 64 << 10;

// torch.from_numpy and torch.bfloat16, looked up once (leaked on purpose:
// they must not be released after the interpreter is gone).
struct TorchApi {
  py::object from_numpy, bfloat16;
};
const TorchApi& Torch() {
  static TorchApi* api = [] {
    py::module_ torch = py::module_::import("torch");
    return new TorchApi{torch.attr("from_numpy"), torch.attr("bfloat16")};
  }();
  return *api;
}

// The type a column is handed out as: torch has no uint16/32/64, so for
// torch those widen to int32 / int64 (uint64 wraps above 2**63).
DType OutType(DType t, Leaf leaf) {
  if (leaf == Leaf::kTorch) {
    if (t == DType::kUInt16) return DType::kInt32;
    if (t == DType::kUInt32 || t == DType::kUInt64) return DType::kInt64;
  }
  return t;
}

template <typename From, typename To>
void Widen(const std::byte* src, void* dst, size_t n) {
  const auto* in = reinterpret_cast<const From*>(src);
  auto* out = static_cast<To*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<To>(in[i]);
}

// A column's bytes still to be copied into the object made for it.
struct PendingCopy {
  ColumnView src;
  DType out_type;
  void* dst;

  void Run() const {
    size_t n = src.nbytes / shmcache::DTypeSize(src.dtype);
    switch (out_type == src.dtype ? DType::kBytes : src.dtype) {
      case DType::kUInt16: return Widen<uint16_t, int32_t>(src.data, dst, n);
      case DType::kUInt32: return Widen<uint32_t, int64_t>(src.data, dst, n);
      case DType::kUInt64: return Widen<uint64_t, int64_t>(src.data, dst, n);
      default: std::memcpy(dst, src.data, src.nbytes);
    }
  }
};

// A C-contiguous array of `dt` and `shape`: over `data` (kept alive by
// `base`, writable only when `writable`) or, without data, newly allocated.
// The numpy C API directly: this is most of the cost of a small hit.
py::array NewArray(const py::dtype& dt, std::span<const int64_t> shape,
                   const void* data, py::handle base, bool writable) {
  constexpr size_t kMaxDims = 32;  // numpy's limit
  if (shape.size() > kMaxDims) throw Error("a column has more dimensions than numpy allows");
  Py_intptr_t dims[kMaxDims];
  for (size_t i = 0; i < shape.size(); ++i) dims[i] = static_cast<Py_intptr_t>(shape[i]);
  auto& api = py::detail::npy_api::get();
  int flags = data != nullptr && writable ? py::detail::npy_api::NPY_ARRAY_WRITEABLE_ : 0;
  PyObject* a = api.PyArray_NewFromDescr_(api.PyArray_Type_, dt.inc_ref().ptr(),
                                          static_cast<int>(shape.size()), dims, nullptr,
                                          const_cast<void*>(data), flags, nullptr);
  if (a == nullptr) throw py::error_already_set();
  auto out = py::reinterpret_steal<py::array>(a);
  if (data != nullptr && api.PyArray_SetBaseObject_(a, base.inc_ref().ptr()) != 0) {
    throw py::error_already_set();
  }
  return out;
}

// Builds the objects of rows: objects are allocated with the GIL held and
// filled by Copy() after, without it for large rows.
class RowBuilder {
 public:
  // owner: the Python Cache object. zero_copy: columns of rows in shared
  // memory become arrays over it (read-only numpy arrays; tensors over
  // memory this process maps PROT_READ, so an in-place write faults), which
  // keep `owner` (and so the mappings) alive. Otherwise, and for rows not
  // in shared memory, a copy.
  RowBuilder(py::handle owner, Leaf leaf, bool zero_copy)
      : owner_(owner), leaf_(leaf), zero_copy_(zero_copy) {}

  // names: the columns wanted, in order (KeyError naming one the row
  // lacks); null for all. single: the one column's value itself.
  py::object Build(uint64_t id, const shmcache::RowView& row,
                   const std::vector<std::string>* names, bool single) {
    py::handle base = zero_copy_ && row.in_shared_memory() ? owner_ : py::handle();
    size_t n = names ? names->size() : row.num_columns();
    if (n == 1) {  // the common bare value: nothing to assemble
      ColumnView c = Find(id, row, names, 0);
      if (single || c.name == "#") return Value(c, base);
    }
    bool positional = true;
    for (size_t i = 0; i < n && positional; ++i) {
      std::string_view name = names ? std::string_view((*names)[i]) : row.column(i).name;
      positional = !name.empty() && name[0] == '#';
    }
    if (positional) {
      py::tuple t(n);
      for (size_t i = 0; i < n; ++i) t[i] = Value(Find(id, row, names, i), base);
      return t;
    }
    py::dict d;
    for (size_t i = 0; i < n; ++i) {
      ColumnView c = Find(id, row, names, i);
      d[py::str(c.name.data(), c.name.size())] = Value(c, base);
    }
    return d;
  }

  // Fills what Build allocated. REQUIRES: the rows are still valid.
  void Copy() {
    if (copy_bytes_ < kReleaseGilBytes) return CopyNow();
    py::gil_scoped_release nogil;
    CopyNow();
  }
  // Bytes of the columns handed out (the wider copy of a widened column
  // counts as the stored bytes).
  uint64_t bytes() const { return bytes_; }

 private:
  static ColumnView Find(uint64_t id, const shmcache::RowView& row,
                         const std::vector<std::string>* names, size_t i) {
    if (names == nullptr) return row.column(i);
    std::optional<ColumnView> c = row.find((*names)[i]);
    if (!c) {
      throw py::key_error("row " + std::to_string(id) + " has no column '" +
                          (*names)[i] + "'");
    }
    return *c;
  }

  void CopyNow() {
    for (const PendingCopy& p : pending_) p.Run();
    pending_.clear();
    copy_bytes_ = 0;
  }

  void Later(const ColumnView& c, DType out, void* dst) {
    pending_.push_back(PendingCopy{c, out, dst});
    copy_bytes_ += c.nbytes;
  }

  py::object Value(const ColumnView& c, py::handle base) {
    bytes_ += c.nbytes;
    if (c.dtype == DType::kBytes) {
      PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<py::ssize_t>(c.nbytes));
      if (b == nullptr) throw py::error_already_set();
      Later(c, c.dtype, PyBytes_AS_STRING(b));
      return py::reinterpret_steal<py::object>(b);
    }
    DType out = OutType(c.dtype, leaf_);
    bool torch_bf16 = leaf_ == Leaf::kTorch && c.dtype == DType::kBFloat16;
    // torch reads a bfloat16 column through an int16 array.
    py::dtype dt = ToNumpy(torch_bf16 ? DType::kInt16 : out);
    py::array a;
    if (base && out == c.dtype) {
      // Tensors need a writable-flagged array (torch warns otherwise); the
      // memory itself is read-only.
      a = NewArray(dt, c.shape, c.data, base, leaf_ == Leaf::kTorch);
    } else {
      a = NewArray(dt, c.shape, nullptr, base, true);
      Later(c, out, a.mutable_data());
    }
    if (leaf_ == Leaf::kNumpy) return a;
    py::object t = Torch().from_numpy(a);
    return torch_bf16 ? t.attr("view")(Torch().bfloat16) : t;
  }

  py::handle owner_;
  Leaf leaf_;
  bool zero_copy_;
  std::vector<PendingCopy> pending_;
  size_t copy_bytes_ = 0;
  uint64_t bytes_ = 0;
};

// Views of rows ids[i]: memory rows from ViewBatch, with the GIL held (no
// system call on a hit); rows on disk are fetched into *disk with one
// GetBatch, without the GIL, and viewed there. statuses[i] as GetBatch's.
void ViewRows(Cache& cache, std::span<const uint64_t> ids,
              std::span<shmcache::RowView> views, std::span<Status> statuses,
              std::vector<shmcache::Row>* disk) {
  Check(cache.ViewBatch(ids, views, statuses));
  std::vector<uint64_t> spilled;
  std::vector<size_t> where;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (statuses[i].IsNotSupported()) {
      spilled.push_back(ids[i]);
      where.push_back(i);
    }
  }
  if (spilled.empty()) return;
  disk->resize(spilled.size());
  std::vector<Status> got(spilled.size());
  Status s;
  {
    py::gil_scoped_release nogil;
    s = cache.GetBatch(spilled, *disk, got);
  }
  Check(s);
  for (size_t k = 0; k < where.size(); ++k) {
    statuses[where[k]] = std::move(got[k]);
    views[where[k]] = (*disk)[k].view();
  }
}

// read(id, columns=None, copy=True, torch=False, single=False)
//   -> row or None
py::object Read(py::handle owner, uint64_t id,
               std::optional<std::vector<std::string>> columns, bool copy,
               bool torch, bool single) {
  PyCache& self = owner.cast<PyCache&>();
  shmcache::RowView view;
  Status status;
  std::vector<shmcache::Row> disk;
  ViewRows(*self.cache, std::span(&id, 1), std::span(&view, 1),
           std::span(&status, 1), &disk);
  if (status.IsNotFound()) return py::none();
  Check(status);
  RowBuilder b(owner, torch ? Leaf::kTorch : Leaf::kNumpy, !copy);
  py::object row = b.Build(id, view, columns ? &*columns : nullptr, single);
  b.Copy();
  self.bytes_read += b.bytes();
  return row;
}

// read_batch(ids, copy=True, torch=False) -> [row or None per id]
py::list ReadBatch(py::handle owner, const std::vector<uint64_t>& ids,
                    bool copy, bool torch) {
  PyCache& self = owner.cast<PyCache&>();
  std::vector<shmcache::RowView> views(ids.size());
  std::vector<Status> statuses(ids.size());
  std::vector<shmcache::Row> disk;
  ViewRows(*self.cache, ids, views, statuses, &disk);
  RowBuilder b(owner, torch ? Leaf::kTorch : Leaf::kNumpy, !copy);
  py::list out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (statuses[i].IsNotFound()) {
      out[i] = py::none();
      continue;
    }
    Check(statuses[i]);
    out[i] = b.Build(ids[i], views[i], nullptr, false);
  }
  b.Copy();
  self.bytes_read += b.bytes();
  return out;
}

// column_dtypes(ids, names) -> [dtype name or None per name] of the first
// of ids that is cached, or None when none is.
py::object ColumnDTypes(PyCache& self, const std::vector<uint64_t>& ids,
                        const std::vector<std::string>& names) {
  shmcache::RowView row;
  Status s = Status::NotFound("no ids");
  {
    // A view of a spilled row asks the daemon.
    py::gil_scoped_release nogil;
    for (uint64_t id : ids) {
      s = self.cache->View(id, &row);
      if (!s.IsNotFound()) break;
    }
  }
  if (s.IsNotFound()) return py::none();
  Check(s);
  py::list out;
  for (const std::string& n : names) {
    std::optional<ColumnView> c = row.find(n);
    out.append(c ? py::object(py::str(shmcache::DTypeName(c->dtype))) : py::none());
  }
  return out;
}

// read_into(ids, targets, threads, hit): targets are (name, dtype name,
// row shape, address, row stride) over buffers the caller checked and keeps
// alive; hit (uint8, len(ids)) receives the hit mask.
void ReadInto(PyCache& self,
              py::array_t<uint64_t, py::array::c_style | py::array::forcecast> ids,
              const py::list& targets, int threads,
              py::array_t<uint8_t, py::array::c_style> hit) {
  size_t n = static_cast<size_t>(ids.size());
  if (static_cast<size_t>(hit.size()) != n) throw py::value_error("hit has another length");
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<shmcache::ColumnTarget> cols(targets.size());
  names.reserve(targets.size());
  shapes.reserve(targets.size());
  for (size_t t = 0; t < cols.size(); ++t) {
    py::tuple spec = targets[t].cast<py::tuple>();
    names.push_back(spec[0].cast<std::string>());
    DType dt;
    if (!shmcache::DTypeFromName(spec[1].cast<std::string>(), &dt)) {
      throw py::value_error("unknown dtype name: " + spec[1].cast<std::string>());
    }
    shapes.push_back(spec[2].cast<std::vector<int64_t>>());
    cols[t] = shmcache::ColumnTarget{names.back(), dt, shapes.back(),
                                     reinterpret_cast<void*>(spec[3].cast<uintptr_t>()),
                                     spec[4].cast<size_t>()};
  }
  std::unique_ptr<shmcache::BatchReader> reader;
  auto& idle = self.idle_readers;
  for (size_t k = 0; k < idle.size(); ++k) {
    if (idle[k]->num_threads() == std::max(threads, 1)) {
      reader = std::move(idle[k]);
      idle.erase(idle.begin() + static_cast<std::ptrdiff_t>(k));
      break;
    }
  }
  if (!reader) reader = std::make_unique<shmcache::BatchReader>(self.cache.get(), threads);
  const uint64_t* id_data = ids.data();
  uint8_t* hit_data = hit.mutable_data();
  Status s;
  {
    py::gil_scoped_release nogil;
    s = reader->ReadInto(std::span(id_data, n), cols, std::span(hit_data, n));
  }
  idle.push_back(std::move(reader));
  Check(s);
}

}  // namespace

PYBIND11_MODULE(_shmcache, m) {
  m.doc() = "Binding of libshmcache; use the `shmcache` package instead.";
  // Translators run newest first: the base class is registered first.
  auto& error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  using Code = Status::Code;
  auto type = [&](Code c, py::handle t) { g_error_types[static_cast<size_t>(c)] = t; };
  type(Code::kOk, error);  // the fallback for the codes not named below
  type(Code::kNotFound, py::register_exception<NotFoundError>(m, "NotFoundError", error.ptr()));
  type(Code::kUnavailable,
       py::register_exception<UnavailableError>(m, "UnavailableError", error.ptr()));
  type(Code::kFull, py::register_exception<FullError>(m, "FullError", error.ptr()));
  type(Code::kFingerprintMismatch,
       py::register_exception<FingerprintMismatchError>(m, "FingerprintMismatchError",
                                                        error.ptr()));
  type(Code::kInvalidArgument,
       py::register_exception<InvalidArgumentError>(m, "InvalidArgumentError",
                                                    error.ptr()));
  type(Code::kNotSupported,
       py::register_exception<NotSupportedError>(m, "NotSupportedError", error.ptr()));
  type(Code::kTooLarge,
       py::register_exception<TooLargeError>(m, "TooLargeError", error.ptr()));
  type(Code::kAlreadyExists,
       py::register_exception<AlreadyExistsError>(m, "AlreadyExistsError", error.ptr()));
  type(Code::kPermissionDenied,
       py::register_exception<PermissionDeniedError>(m, "PermissionDeniedError",
                                                     error.ptr()));

  py::class_<PyCache, PyCachePtr>(m, "Cache")
      .def("put", &Put, py::arg("id"), py::arg("columns"),
           "Stores a row; returns False when the id was already present.")
      .def("put_batch", &PutBatch, py::arg("ids"), py::arg("rows"),
           "Stores rows[i] under ids[i]: ([inserted per row], [(index, "
           "exception put would raise)]).")
      .def("get", &Get, py::arg("id"), py::arg("columns") = py::none(),
           py::arg("copy") = true, py::arg("readonly") = true,
           "A list of (name, dtype, array), or None on a miss.")
      .def("get_batch", &GetBatch, py::arg("ids"), py::arg("copy") = true,
           py::arg("readonly") = true,
           "For each id, a list of (name, dtype, array) or None on a miss.")
      .def("read", &Read, py::arg("id"), py::arg("columns") = py::none(),
           py::arg("copy") = true, py::arg("torch") = false, py::arg("single") = false,
           "The row as put stored it, or None on a miss.")
      .def("read_batch", &ReadBatch, py::arg("ids"), py::arg("copy") = true,
           py::arg("torch") = false,
           "[row or None per id].")
      .def_property_readonly("bytes_read", [](PyCache& self) { return self.bytes_read; },
                             "Bytes of the columns read and read_batch returned.")
      .def("column_dtypes", &ColumnDTypes, py::arg("ids"), py::arg("names"),
           "Stored dtype names of the named columns in the first cached row of ids.")
      .def("read_into", &ReadInto, py::arg("ids"), py::arg("targets"),
           py::arg("threads"), py::arg("hit"),
           "Copies rows into caller-checked buffers; fills the hit mask.")
      .def("contains", [](PyCache& self, uint64_t id) {
        py::gil_scoped_release nogil;
        return self.cache->Contains(id);
      })
      .def("stats", [](PyCache& self) {
        shmcache::CacheStats st;
        Check(self.cache->GetStats(&st));
        return StatsDict(st);
      })
      .def("is_full", [](PyCache& self) { return self.cache->IsFull(); })
      .def("claim_build", [](PyCache& self) {
        bool claimed = false;
        Status s;
        {
          py::gil_scoped_release nogil;
          s = self.cache->ClaimBuild(&claimed);
        }
        Check(s);
        return claimed;
      }, "Claims the build of a streaming cache: True for the first caller only.")
      .def("seal", [](PyCache& self, uint64_t num_rows) {
        Status s;
        {
          py::gil_scoped_release nogil;
          s = self.cache->Seal(num_rows);
        }
        Check(s);
      }, py::arg("num_rows"), "Seals the cache as holding rows 0..num_rows-1 (the first seal wins).")
      .def("sealed_rows", [](PyCache& self) -> std::optional<uint64_t> {
        uint64_t n = 0;
        Status s;
        {
          py::gil_scoped_release nogil;
          s = self.cache->GetSealedRows(&n);
        }
        if (s.IsNotFound()) return std::nullopt;
        Check(s);
        return n;
      }, "The row count the cache was sealed with, or None while it is not sealed.")
      .def_property_readonly("cache_id", [](PyCache& self) { return self.cache->cache_id(); })
      .def_property_readonly("session_id",
                             [](PyCache& self) { return self.cache->session_id(); })
      .def("close", [](PyCache& self) {
        py::gil_scoped_release nogil;
        self.cache->Close();
      });

  py::class_<Client, std::shared_ptr<Client>>(m, "Client")
      .def(py::init([](int port, const std::string& hostname,
                       const std::string& run_dir, int timeout_ms) {
             shmcache::ClientOptions o;
             o.port = port;
             o.hostname = hostname;
             o.run_dir = run_dir;
             o.request_timeout_ms = timeout_ms;
             std::unique_ptr<Client> c;
             Status s;
             {
               py::gil_scoped_release nogil;
               s = Client::Connect(o, &c);
             }
             Check(s);
             return std::shared_ptr<Client>(std::move(c));
           }),
           py::arg("port") = 0, py::arg("hostname") = "", py::arg("run_dir") = "",
           py::arg("timeout_ms") = 5000)
      .def("create_session", [](Client& c) {
        uint32_t id = 0;
        Check(c.CreateSession(&id));
        return id;
      })
      .def("destroy_session", [](Client& c, uint32_t id) { Check(c.DestroySession(id)); })
      .def("check_session", [](Client& c, uint32_t id) { Check(c.CheckSession(id)); })
      .def("open_cache",
           [](Client& c, uint32_t session_id, const std::string& name,
              const std::string& fingerprint, uint64_t size_mb, bool spilling) {
             shmcache::CacheOptions o;
             o.session_id = session_id;
             o.name = name;
             o.fingerprint = fingerprint;
             o.size_mb = size_mb;
             o.spilling = spilling;
             auto out = std::make_shared<PyCache>();
             Status s;
             {
               py::gil_scoped_release nogil;
               s = c.OpenCache(o, &out->cache);
             }
             Check(s);
             return out;
           },
           py::arg("session_id"), py::arg("name"), py::arg("fingerprint"),
           py::arg("size_mb") = 0, py::arg("spilling") = false)
      .def("list_sessions", [](Client& c) {
        std::vector<shmcache::SessionInfo> sessions;
        Check(c.ListSessions(&sessions));
        py::list out;
        for (const auto& s : sessions) {
          py::list caches;
          for (const auto& st : s.caches) caches.append(StatsDict(st));
          py::dict d;
          d["session_id"] = s.session_id;
          d["caches"] = caches;
          out.append(d);
        }
        return out;
      })
      .def("server_info", [](Client& c) {
        shmcache::ServerInfo i;
        Check(c.GetServerInfo(&i));
        py::dict d;
        d["instance"] = i.instance;
        d["port"] = i.port;
        d["socket_path"] = i.socket_path;
        d["shm_dir"] = i.shm_dir;
        d["shm_huge_pages"] = i.shm_huge_pages;
        d["shm_pages"] = i.shm_pages;
        d["pid"] = i.pid;
        d["workers"] = i.workers;
        d["log_level"] = i.log_level;
        d["log_path"] = i.log_path;
        d["spill_dir"] = i.spill_dir;
        d["memory_cap_bytes"] = i.memory_cap_bytes;
        d["memory_used_bytes"] = i.memory_used_bytes;
        d["memory_held_bytes"] = i.memory_held_bytes;
        d["memory_cap_bound"] = i.memory_cap_bound;
        d["memory_requested_bound"] = i.memory_requested_bound;
        d["memory_requested_bytes"] = i.memory_requested_bytes;
        d["memory_cgroup_bytes"] = i.memory_cgroup_bytes;
        d["memory_cgroup_limit_bytes"] = i.memory_cgroup_limit_bytes;
        d["memory_shm_bytes"] = i.memory_shm_bytes;
        d["numa_nodes"] = i.numa_nodes;
        d["sessions"] = i.sessions;
        d["connections"] = i.connections;
        d["start_time_unix"] = i.start_time_unix;
        d["uptime_seconds"] = i.uptime_seconds;
        return d;
      })
      .def("stop_server", [](Client& c) { Check(c.StopServer()); });
}
