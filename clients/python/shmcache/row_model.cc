#include "clients/python/shmcache/row_model.h"

#include <bit>
#include <cstring>
#include <optional>

#include "clients/python/shmcache/dlpack_tensor.h"
#include "clients/python/shmcache/release_gil.h"

namespace shmcache::python {
namespace {

// Copies smaller than this are made with the GIL held: releasing and taking
// it back costs about as much as copying a few KB, and no other thread can
// get anything done in that time.
constexpr size_t kReleaseGilBytes = 64 << 10;

// Python objects looked up once (leaked on purpose: they must not be
// released after the interpreter is gone). torch and PIL are imported on
// first use only: a numpy-only user never pays for them.
struct NumpyApi {
  py::object asarray, generic;
};
const NumpyApi& Numpy() {
  static NumpyApi* api = [] {
    py::module_ np = py::module_::import("numpy");
    return new NumpyApi{np.attr("asarray"), np.attr("generic")};
  }();
  return *api;
}
struct TorchApi {
  py::object tensor, from_numpy, bfloat16, int16;
};
// torch.Tensor's type once TorchApi exists (null before): an exact tensor
// is recognised with one pointer compare, without importing torch for it.
PyTypeObject* g_tensor_type = nullptr;
const TorchApi& Torch() {
  static TorchApi* api = [] {
    py::module_ torch = py::module_::import("torch");
    auto* made = new TorchApi{torch.attr("Tensor"), torch.attr("from_numpy"),
                              torch.attr("bfloat16"), torch.attr("int16")};
    g_tensor_type = reinterpret_cast<PyTypeObject*>(made->tensor.ptr());
    return made;
  }();
  return *api;
}

// The array of a plain CPU tensor, which Tensor.numpy() gives sharing its
// memory (strided as the tensor is: Native makes it C-contiguous), or
// nothing. One call instead of detach().cpu().contiguous().numpy(): those
// were most of encoding a small row. numpy() refuses what the slow path
// must handle (a tensor that requires grad, one on a device, bfloat16, a
// conjugate or negative view): then it returns nothing and the error is
// cleared.
std::optional<py::array> PlainTensorArray(py::handle v) {
  if (g_tensor_type == nullptr || Py_TYPE(v.ptr()) != g_tensor_type) return std::nullopt;
  static PyObject* numpy_name = PyUnicode_InternFromString("numpy");
  if (numpy_name == nullptr) throw py::error_already_set();
  PyObject* a = PyObject_CallMethodNoArgs(v.ptr(), numpy_name);
  if (a == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  auto out = py::reinterpret_steal<py::object>(a);
  if (!py::isinstance<py::array>(out)) return std::nullopt;
  return py::reinterpret_borrow<py::array>(out);
}
struct PilApi {
  py::object image, fromarray;
};
const PilApi& Pil() {
  static PilApi* api = [] {
    py::module_ image = py::module_::import("PIL.Image");
    return new PilApi{image.attr("Image"), image.attr("fromarray")};
  }();
  return *api;
}

// PIL modes whose np.asarray PIL.Image.fromarray turns back into the same
// image ("P" would lose its palette: convert it first).
bool RoundTrips(std::string_view mode) {
  for (std::string_view m : {"1", "L", "LA", "I", "I;16", "F", "RGB", "RGBA", "RGBX",
                             "CMYK", "YCbCr", "LAB", "HSV"}) {
    if (mode == m) return true;
  }
  return false;
}

// PIL modes whose pixels are 3 or 2 bytes in an array and 4 in a PIL
// image: PIL.Image.frombuffer always copies them (it maps a buffer only
// where the two layouts are one).
bool PilUnpacks(std::string_view mode) {
  for (std::string_view m : {"RGB", "YCbCr", "LAB", "HSV", "LA"}) {
    if (mode == m) return true;
  }
  return false;
}

bool ModuleStartsWith(py::handle v, std::string_view prefix) {
  py::object mod = py::type::handle_of(v).attr("__module__");
  if (!PyUnicode_Check(mod.ptr())) return false;
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(mod.ptr(), &n);
  return s != nullptr && std::string_view(s, static_cast<size_t>(n)).starts_with(prefix);
}

bool IsNative(const py::dtype& dt) {
  constexpr char kNative = std::endian::native == std::endian::little ? '<' : '>';
  char b = dt.byteorder();
  return b == '=' || b == '|' || b == kNative;
}

// `v` as a C-contiguous array in native byte order, values and shape
// unchanged; an array already so is returned as it is.
py::array Native(py::handle v) {
  if (py::isinstance<py::array>(v)) {
    auto a = py::reinterpret_borrow<py::array>(v);
    if (IsNative(a.dtype()) && (a.flags() & py::array::c_style)) return a;
    py::dtype dt = a.dtype().attr("newbyteorder")("=");
    return Numpy().asarray(a, dt, "C");
  }
  py::array a = Numpy().asarray(v);
  return Native(a);
}

py::tuple Column(const std::string& name, const py::array& a, DType dt) {
  return py::make_tuple(name, DTypeName(dt), a);
}

// The stored name of a Python number's column (row_model.h).
std::string NumberName(const std::string& name) {
  return name + kTagSep + std::string(kNumberTag);
}

// The Python number of a kNumberTag column; empty when the column is not
// one a number made (it is then decoded as an array).
py::object Number(const ColumnView& c) {
  PyObject* made = nullptr;
  if (!c.shape.empty()) return {};
  if (c.dtype == DType::kInt64 && c.nbytes == sizeof(int64_t)) {
    int64_t v = 0;
    std::memcpy(&v, c.data, sizeof v);
    made = PyLong_FromLongLong(v);
  } else if (c.dtype == DType::kFloat64 && c.nbytes == sizeof(double)) {
    double v = 0;
    std::memcpy(&v, c.data, sizeof v);
    made = PyFloat_FromDouble(v);
  } else if (c.dtype == DType::kBool && c.nbytes == 1) {
    made = PyBool_FromLong(std::to_integer<int>(c.data[0]) != 0 ? 1 : 0);
  } else {
    return {};
  }
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(made);
}

// The column of one value of a sample.
py::tuple EncodeLeaf(const std::string& name, py::handle v) {
  if (py::isinstance<py::array>(v)) {
    py::array a = Native(v);
    DType dt = FromNumpy(a.dtype());
    return Column(name, a, dt);
  }
  if (PyBytes_Check(v.ptr()) || PyByteArray_Check(v.ptr()) ||
      PyMemoryView_Check(v.ptr())) {
    py::buffer_info b = py::reinterpret_borrow<py::buffer>(v).request();
    auto n = static_cast<py::ssize_t>(b.size * b.itemsize);
    py::array_t<uint8_t> a(n);
    if (n) std::memcpy(a.mutable_data(), b.ptr, static_cast<size_t>(n));
    return Column(name, a, DType::kBytes);
  }
  if (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) {
    // Python ints are int64 columns on every platform. One outside int64
    // (a 64-bit hash label) has no column: stored as uint64 it would come
    // back as another number (torch has no uint64).
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow != 0) {
      throw py::type_error("cannot cache the int " + py::str(v).cast<std::string>() +
                           " in column '" + name +
                           "': it is outside int64 [-2**63, 2**63-1] (a numpy "
                           "uint64 holds 0..2**64-1)");
    }
    py::array_t<int64_t> a(std::vector<py::ssize_t>{});
    *a.mutable_data() = static_cast<int64_t>(value);
    return Column(NumberName(name), a, DType::kInt64);
  }
  // Before the float check: numpy.float64 is a Python float too, and a
  // numpy scalar comes back as a 0-d tensor, as DataLoader converts it.
  if (PyComplex_Check(v.ptr()) || py::isinstance(v, Numpy().generic)) {
    py::array a = Native(v);
    DType dt = FromNumpy(a.dtype());
    return Column(name, a, dt);
  }
  if (PyBool_Check(v.ptr()) || PyFloat_Check(v.ptr())) {
    py::array a = Native(v);
    DType dt = FromNumpy(a.dtype());
    return Column(NumberName(name), a, dt);
  }
  if (std::optional<py::array> plain = PlainTensorArray(v)) {
    py::array a = Native(*plain);
    DType dt = FromNumpy(a.dtype());
    return Column(name, a, dt);
  }
  if (ModuleStartsWith(v, "torch") && py::isinstance(v, Torch().tensor)) {
    // A conjugate or negative view holds other numbers than it shows:
    // resolved (copied) first.
    py::object t = v.attr("detach")()
                       .attr("cpu")()
                       .attr("resolve_conj")()
                       .attr("resolve_neg")()
                       .attr("contiguous")();
    if (py::object(t.attr("dtype")).is(Torch().bfloat16)) {
      py::array a = t.attr("view")(Torch().int16).attr("numpy")().attr("view")("uint16");
      return Column(name, a, DType::kBFloat16);
    }
    py::array a = t.attr("numpy")();
    DType dt = FromNumpy(a.dtype());
    return Column(name, a, dt);
  }
  if (ModuleStartsWith(v, "PIL.") && py::isinstance(v, Pil().image)) {
    auto mode = v.attr("mode").cast<std::string>();
    if (!RoundTrips(mode)) {
      throw py::type_error("cannot cache a PIL image of mode " + mode +
                           ": convert it first (e.g. image.convert(\"RGB\"))");
    }
    py::array a = Native(Numpy().asarray(v));
    DType dt = FromNumpy(a.dtype());
    return Column(name + kTagSep + mode, a, dt);
  }
  throw py::type_error("cannot cache a value of type " +
                       py::type::handle_of(v).attr("__name__").cast<std::string>() +
                       ": use numpy arrays, tensors, numbers, bytes or PIL images");
}

template <typename From, typename To>
void Widen(const std::byte* src, void* dst, size_t n) {
  const auto* in = reinterpret_cast<const From*>(src);
  auto* out = static_cast<To*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<To>(in[i]);
}

// The type a column is handed out as (TorchName's rule).
DType OutType(DType t, Leaf leaf) {
  if (leaf == Leaf::kTorch) {
    if (t == DType::kUInt16) return DType::kInt32;
    if (t == DType::kUInt32 || t == DType::kUInt64) return DType::kInt64;
  }
  return t;
}

// The most dimensions a column handed out may have: numpy's limit, which
// the tensors made without numpy (dlpack_tensor.h) keep to as well.
constexpr size_t kMaxDims = 32;

// Elements of a column. Columns reach here decoded, so their dtype is
// known; the guard keeps an unknown one from dividing by zero.
size_t Elements(const ColumnView& c) {
  size_t elem = DTypeSize(c.dtype);
  return elem == 0 ? 0 : c.nbytes / elem;
}

// A C-contiguous array of `dt` and `shape`: over `data` (kept alive by
// `base`, writable only when `writable`) or, without data, newly allocated.
// The numpy C API directly: this is most of the cost of a small hit.
py::array NewArray(const py::dtype& dt, std::span<const int64_t> shape, const void* data,
                   py::handle base, bool writable) {
  if (shape.size() > kMaxDims) {
    throw py::value_error("a column has more dimensions than numpy allows");
  }
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

py::dtype MakeNumpyType(DType t) {
  switch (t) {
    case DType::kBFloat16: return py::dtype("uint16");
    case DType::kBytes: return py::dtype("uint8");
    default: return py::dtype(DTypeName(t));
  }
}

}  // namespace

DType FromNumpy(const py::dtype& dt) {
  char kind = dt.kind();
  size_t size = static_cast<size_t>(dt.itemsize());
  switch (kind) {
    case 'b': return DType::kBool;
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
    case 'c':
      if (size == 8) return DType::kComplex64;
      if (size == 16) return DType::kComplex128;
      break;
    default: break;
  }
  throw py::type_error("unsupported array dtype: " +
                       py::str(static_cast<py::object>(dt)).cast<std::string>());
}

// Built once per type: parsing a dtype name costs more than the rest of a
// small hit. (Leaked: never released after the interpreter is gone.)
py::dtype ToNumpy(DType t) {
  static auto* types = [] {
    auto* v = new std::vector<py::dtype>;
    for (int i = 0; i < kNumDTypes; ++i)
      v->push_back(MakeNumpyType(static_cast<DType>(i)));
    return v;
  }();
  auto i = static_cast<size_t>(t);
  if (i >= types->size()) throw py::value_error("row holds an unknown dtype");
  return (*types)[i];
}

const char* TorchName(DType t) {
  if (t == DType::kBytes) return "";
  return DTypeName(OutType(t, Leaf::kTorch));
}

py::dict DTypeTable() {
  py::dict d;
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    const char* torch = TorchName(t);
    d[DTypeName(t)] =
        py::make_tuple(DTypeSize(t), ToNumpy(t).attr("name"),
                       *torch ? py::object(py::str(torch)) : py::object(py::none()));
  }
  return d;
}

namespace {
// Where the tag starts, or name.size(). A loop, not find(): names are a
// few bytes, and libc's memchr call cost more than the search (3% of a
// small hit's time under perf).
size_t TagAt(std::string_view name) {
  size_t i = 0;
  while (i < name.size() && name[i] != kTagSep) ++i;
  return i;
}
}  // namespace

std::string_view KeyOf(std::string_view stored) {
  return stored.substr(0, TagAt(stored));
}

std::string_view TagOf(std::string_view stored) {
  size_t at = TagAt(stored);
  return at == stored.size() ? std::string_view() : stored.substr(at + 1);
}

RowKind KindOf(std::span<const std::string_view> keys) {
  if (keys.size() == 1 && keys[0].size() == 1 && keys[0][0] == kPos)
    return RowKind::kValue;
  for (std::string_view k : keys) {
    if (k.empty() || k[0] != kPos) return RowKind::kDict;
  }
  return RowKind::kTuple;
}

const char* KindName(RowKind k) {
  switch (k) {
    case RowKind::kValue: return "value";
    case RowKind::kTuple: return "tuple";
    case RowKind::kDict: return "dict";
  }
  return "dict";
}

py::list Encode(py::handle sample) {
  py::list out;
  if (PyDict_Check(sample.ptr())) {
    for (auto [k, v] : py::reinterpret_borrow<py::dict>(sample)) {
      if (!PyUnicode_Check(k.ptr())) {
        throw py::type_error("column names must be str, got " +
                             py::type::handle_of(k).attr("__name__").cast<std::string>());
      }
      auto name = k.cast<std::string>();
      if (!name.empty() && name[0] == kPos) {
        throw py::value_error("column names may not start with '#': '" + name + "'");
      }
      if (name.find(kTagSep) != std::string::npos) {
        throw py::value_error("column names may not hold the character \\x1f");
      }
      out.append(EncodeLeaf(name, v));
    }
    return out;
  }
  if (PyTuple_Check(sample.ptr()) || PyList_Check(sample.ptr())) {
    size_t i = 0;
    for (py::handle v : sample) out.append(EncodeLeaf(kPos + std::to_string(i++), v));
    return out;
  }
  out.append(EncodeLeaf(std::string(1, kPos), sample));
  return out;
}

py::list EncodeAll(const py::iterable& samples) {
  py::list out;
  for (py::handle s : samples) out.append(Encode(s));
  return out;
}

namespace {
// The array of a column: an array that is one already (a C-contiguous
// ndarray, what encode makes) as it is, without numpy's conversion call
// (PyArray_FromAny: a quarter of put_batch's instructions for a row).
py::array ColumnArray(py::handle v) {
  if (Py_TYPE(v.ptr()) == py::detail::npy_api::get().PyArray_Type_) {
    auto a = py::reinterpret_borrow<py::array>(v);
    if (a.flags() & py::array::c_style) return a;
  }
  return py::array::ensure(v, py::array::c_style);
}

// Whether an array's items are (or hold) Python objects: kind 'O', or a
// structured dtype with an object field.
bool HoldsObjects(const py::dtype& d) {
  const char kind = d.kind();
  return kind == 'O' || (kind == 'V' && d.attr("hasobject").cast<bool>());
}

DType ColumnType(py::handle dtype_obj, const py::array& a) {
  if (dtype_obj.is_none()) return FromNumpy(a.dtype());
  std::string cast;  // of a name that is not a str: cast raises its error
  std::string_view name;
  if (PyUnicode_Check(dtype_obj.ptr())) {
    Py_ssize_t len = 0;
    const char* s = PyUnicode_AsUTF8AndSize(dtype_obj.ptr(), &len);
    if (s == nullptr) throw py::error_already_set();
    name = std::string_view(s, static_cast<size_t>(len));
  } else {
    cast = dtype_obj.cast<std::string>();
    name = cast;
  }
  DType dt;
  if (!DTypeFromName(name, &dt)) {
    throw py::value_error("unknown dtype name: " + std::string(name));
  }
  return dt;
}
}  // namespace

void ParsedColumns::Reserve(size_t rows, size_t columns) {
  row_ends_.reserve(rows);
  arrays_.reserve(columns);
  tuples_.reserve(columns);
  views_.reserve(columns);
  dims_at_.reserve(columns);
  dims_.reserve(columns * 3);
}

void ParsedColumns::AddRow(const py::list& columns) {
  size_t n = columns.size();
  for (size_t i = 0; i < n; ++i) {
    // Held from here: the array's conversion below may run Python code
    // (an __array__) that empties the list, which held the tuple alone,
    // and the name and dtype read from it must stay.
    py::object t = columns[i];
    if (!PyTuple_Check(t.ptr()) || PyTuple_GET_SIZE(t.ptr()) != 3) {
      throw py::value_error("a column is (name, dtype name or None, array)");
    }
    py::handle name_obj = PyTuple_GET_ITEM(t.ptr(), 0);
    Py_ssize_t len = 0;
    const char* s = PyUnicode_Check(name_obj.ptr())
                        ? PyUnicode_AsUTF8AndSize(name_obj.ptr(), &len)
                        : nullptr;
    if (s == nullptr) throw py::type_error("a column name is a str");
    std::string_view name(s, static_cast<size_t>(len));
    py::array a = ColumnArray(PyTuple_GET_ITEM(t.ptr(), 2));
    if (!a) throw py::type_error("column '" + std::string(name) + "' is not an array");
    // Whatever dtype name comes with it: its bytes are the objects'
    // addresses, which every process of the session would read as numbers.
    if (HoldsObjects(a.dtype())) {
      throw py::type_error("column '" + std::string(name) +
                           "' holds Python objects (dtype object), which a row "
                           "cannot hold: convert them to numbers first");
    }
    // Rows hold native values: a foreign byte order would read back as
    // other numbers.
    if (!IsNative(a.dtype())) {
      throw py::value_error("column '" + std::string(name) +
                            "': the array is not in native byte order; convert "
                            "it first (a.astype(a.dtype.newbyteorder('=')))");
    }
    DType dt = ColumnType(PyTuple_GET_ITEM(t.ptr(), 1), a);
    if (DTypeSize(dt) != static_cast<size_t>(a.itemsize())) {
      throw py::value_error("column '" + std::string(name) +
                            "': array itemsize does not match its dtype");
    }
    // The shapes are copied (another thread may reshape an array while a
    // put runs without the GIL); the views point into dims_, pointed again
    // when it moves.
    const int64_t* before = dims_.data();
    const size_t at = dims_.size(), ndim = static_cast<size_t>(a.ndim());
    dims_.insert(dims_.end(), a.shape(), a.shape() + ndim);
    if (dims_.data() != before) {
      for (size_t v = 0; v < views_.size(); ++v) {
        views_[v].shape = std::span(dims_.data() + dims_at_[v], views_[v].shape.size());
      }
    }
    dims_at_.push_back(at);
    views_.push_back(ColumnView{name, dt, std::span(dims_.data() + at, ndim),
                                static_cast<const std::byte*>(a.data()),
                                static_cast<size_t>(a.nbytes())});
    arrays_.push_back(std::move(a));
    // The name is a view of the tuple's str: held, so that the list the
    // tuple was in may change (another thread, while a put runs without
    // the GIL) and the name stays.
    tuples_.push_back(std::move(t));
  }
  row_ends_.push_back(views_.size());
}

namespace {
// "row 3 has no column 'nope'", then what the row has and what to pass:
// a KeyError that says only the first half leaves the user to guess the
// row's columns (a tuple's are positions, stored as "#0", "#1", ...).
std::string NoColumn(uint64_t id, const std::string& want, const RowView& row) {
  std::string msg = "row " + std::to_string(id) + " has no column '" + want + "'";
  std::string has;     // as stored: "#0, #1"
  std::string quoted;  // as a dict's keys are written: "'img', 'label'"
  bool positions = true;
  for (size_t i = 0; i < row.num_columns(); ++i) {
    std::string key(KeyOf(row.column(i).name));
    positions = positions && !key.empty() && key[0] == kPos;
    has += (i ? ", " : "") + key;
    quoted += (i ? ", '" : "'") + key + "'";
  }
  if (row.num_columns() == 1 && has.size() == 1 && has[0] == kPos) {
    return msg + ": it holds one value, not columns; pass columns=None";
  }
  if (positions) {
    return msg + ": its columns are the positions of a tuple sample (" + has +
           " as stored), 0.." + std::to_string(row.num_columns() - 1) +
           "; pass columns= some of them, or None for all";
  }
  return msg + ": its columns are " + quoted +
         "; pass columns= some of them, or None for all";
}
}  // namespace

std::vector<ColumnView> SelectColumns(uint64_t id, const RowView& row,
                                      const std::vector<std::string>* names) {
  std::vector<ColumnView> out;
  if (names == nullptr) {
    out.reserve(row.num_columns());
    for (size_t i = 0; i < row.num_columns(); ++i) out.push_back(row.column(i));
    return out;
  }
  out.reserve(names->size());
  for (const std::string& want : *names) {
    std::optional<ColumnView> c = row.find(want);
    for (size_t i = 0; !c && i < row.num_columns(); ++i) {
      if (KeyOf(row.column(i).name) == want) c = row.column(i);
    }
    if (!c) {
      throw py::key_error(NoColumn(id, want, row));
    }
    out.push_back(*c);
  }
  return out;
}

py::object Decode(const py::list& columns, bool torch) {
  ParsedColumns parsed;
  parsed.AddRow(columns);
  std::vector<py::handle> bases(parsed.arrays().begin(), parsed.arrays().end());
  RowBuilder b(torch ? Leaf::kTorch : Leaf::kNumpy, /*zero_copy=*/true);
  py::object row = b.Build(parsed.row(0), bases, false);
  b.Copy();
  return row;
}

void RowBuilder::PendingCopy::Run() const {
  size_t n = Elements(src);
  switch (out_type == src.dtype ? DType::kBytes : src.dtype) {
    case DType::kUInt16: return Widen<uint16_t, int32_t>(src.data, dst, n);
    case DType::kUInt32: return Widen<uint32_t, int64_t>(src.data, dst, n);
    case DType::kUInt64: return Widen<uint64_t, int64_t>(src.data, dst, n);
    default: std::memcpy(dst, src.data, src.nbytes);
  }
}

py::object RowBuilder::Build(std::span<const ColumnView> cols,
                             std::span<const py::handle> bases, bool single) {
  size_t n = cols.size();
  if (n == 1 && (single || KeyOf(cols[0].name) == std::string_view(&kPos, 1))) {
    return Value(cols[0], bases[0]);  // the common bare value
  }
  bool positional = true;
  for (size_t i = 0; i < n && positional; ++i) {
    positional = !cols[i].name.empty() && cols[i].name[0] == kPos;
  }
  if (positional) {
    py::tuple t(n);
    for (size_t i = 0; i < n; ++i) t[i] = Value(cols[i], bases[i]);
    return t;
  }
  py::dict d;
  for (size_t i = 0; i < n; ++i) {
    std::string_view key = KeyOf(cols[i].name);
    d[py::str(key.data(), key.size())] = Value(cols[i], bases[i]);
  }
  return d;
}

void RowBuilder::Copy() {
  if (copy_bytes_ < kReleaseGilBytes) return CopyNow();
  ReleaseGil nogil;
  CopyNow();
}

void RowBuilder::CopyNow() {
  for (size_t i = 0; i < num_pending_ && i < kInline; ++i) inline_[i].Run();
  for (const PendingCopy& p : more_) p.Run();
  num_pending_ = 0;
  more_.clear();
  copy_bytes_ = 0;
}

void RowBuilder::Later(const ColumnView& c, DType out, void* dst) {
  if (num_pending_ < kInline) {
    inline_[num_pending_] = PendingCopy{c, out, dst};
  } else {
    more_.push_back(PendingCopy{c, out, dst});
  }
  ++num_pending_;
  copy_bytes_ += c.nbytes;
}

py::object RowBuilder::Value(const ColumnView& c, py::handle base) {
  bytes_ += c.nbytes;
  if (c.dtype == DType::kBytes) {
    PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<py::ssize_t>(c.nbytes));
    if (b == nullptr) throw py::error_already_set();
    Later(c, c.dtype, PyBytes_AS_STRING(b));
    return py::reinterpret_steal<py::object>(b);
  }
  std::string_view mode = TagOf(c.name);
  if (mode == kNumberTag) {
    // A sample's number is the number again (an int, not a 0-d tensor made
    // for it: that was most of a small tuple hit's cost); numpy rows keep
    // their 0-d arrays.
    if (leaf_ == Leaf::kTorch) {
      if (py::object number = Number(c)) return number;
    }
    mode = std::string_view();
  }
  if (!mode.empty()) {
    py::str m(mode.data(), mode.size());
    if (PilUnpacks(mode)) {
      // PIL copies these pixels into an image of its own as it makes it
      // (widening them to its 4-byte pixels): it reads them where they are,
      // through a read-only array it does not keep.
      return Pil().fromarray(
          NewArray(ToNumpy(c.dtype), c.shape, c.data, base ? base : py::none(), false),
          m);
    }
    // Modes PIL may map instead of copying: an array of the image's own,
    // filled now, before PIL reads it.
    py::array a = NewArray(ToNumpy(c.dtype), c.shape, nullptr, py::handle(), true);
    if (c.nbytes) std::memcpy(a.mutable_data(), c.data, c.nbytes);
    // A "1" image's array has a byte per pixel, which PIL reads as such
    // only when it picks the mode from the array's dtype (with mode="1" it
    // reads packed bits).
    if (mode == "1") return Pil().fromarray(a);
    return Pil().fromarray(a, m);
  }
  if (!zero_copy_) base = py::handle();
  DType out = OutType(c.dtype, leaf_);
  bool view = base && out == c.dtype;
  if (leaf_ == Leaf::kTorch && !view && c.shape.size() <= kMaxDims) {
    if (std::optional<OwnedTensor> t =
            NewTensor(out, c.shape, Elements(c) * DTypeSize(out))) {
      Later(c, out, t->data);
      return std::move(t->tensor);
    }
  }
  bool torch_bf16 = leaf_ == Leaf::kTorch && c.dtype == DType::kBFloat16;
  // torch reads a bfloat16 column through an int16 array.
  py::dtype dt = ToNumpy(torch_bf16 ? DType::kInt16 : out);
  // One array made, never a default one first (py::array() allocates an
  // empty array: a third of a small view's cost).
  py::array a = view ? NewArray(dt, c.shape, c.data, base, leaf_ == Leaf::kTorch)
                     : NewArray(dt, c.shape, nullptr, py::handle(), true);
  if (!view) Later(c, out, a.mutable_data());
  if (leaf_ == Leaf::kNumpy) return a;
  // One vectorcall, without pybind11's argument tuple: this is a large
  // part of a small hit's cost.
  PyObject* made = PyObject_CallOneArg(Torch().from_numpy.ptr(), a.ptr());
  if (made == nullptr) throw py::error_already_set();
  auto t = py::reinterpret_steal<py::object>(made);
  return torch_bf16 ? t.attr("view")(Torch().bfloat16) : t;
}

}  // namespace shmcache::python
