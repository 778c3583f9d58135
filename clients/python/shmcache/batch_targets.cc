#include "clients/python/shmcache/batch_targets.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <bit>
#include <string_view>
#include <utility>

#include "clients/python/shmcache/row_model.h"
#include "shmcache/cache.h"

namespace shmcache::python {
namespace {

[[noreturn]] void BadId(py::handle v) {
  throw py::value_error("row id " + py::str(v).cast<std::string>() + " outside [0, " +
                        std::to_string(kMaxRowId) + "]");
}

uint64_t IdOf(py::handle v) {
  if (PyLong_CheckExact(v.ptr())) {  // the common case: no new object
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow == 0 && s >= 0 && static_cast<uint64_t>(s) <= kMaxRowId) {
      return static_cast<uint64_t>(s);
    }
  }
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) {
    throw py::type_error("a row id is an int, got " +
                         py::type::handle_of(v).attr("__name__").cast<std::string>());
  }
  auto i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  long long s = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow == 0 && s >= 0 && static_cast<uint64_t>(s) <= kMaxRowId) {
    return static_cast<uint64_t>(s);
  }
  if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
    if (!PyErr_Occurred() && u <= kMaxRowId) return u;
    PyErr_Clear();
  }
  if (PyErr_Occurred()) throw py::error_already_set();
  BadId(i);
}

template <typename T>
void CopyIds(const py::array& a, std::vector<uint64_t>* out) {
  auto c = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
  const T* p = c.data();
  for (py::ssize_t k = 0; k < c.size(); ++k) {
    if constexpr (std::is_signed_v<T>) {
      if (p[k] < 0) BadId(py::int_(p[k]));
    }
    if (static_cast<uint64_t>(p[k]) > kMaxRowId) BadId(py::int_(p[k]));
    out->push_back(static_cast<uint64_t>(p[k]));
  }
}

bool IsNative(const py::dtype& dt) {
  constexpr char kNative = std::endian::native == std::endian::little ? '<' : '>';
  char b = dt.byteorder();
  return b == '=' || b == '|' || b == kNative;
}

// torch's dtypes that a cache column has, looked up once (leaked: never
// released after the interpreter is gone).
struct TorchTypes {
  py::object tensor;
  std::vector<std::pair<py::object, DType>> dtypes;
  std::string names;  // for the message naming them
};
const TorchTypes& Torch() {
  static TorchTypes* types = [] {
    py::module_ torch = py::module_::import("torch");
    auto* t = new TorchTypes{torch.attr("Tensor"), {}, {}};
    // In the order of their names, as the message lists them.
    for (auto [name, dt] : {std::pair{"bfloat16", DType::kBFloat16},
                            {"bool", DType::kBool},
                            {"complex128", DType::kComplex128},
                            {"complex64", DType::kComplex64},
                            {"float16", DType::kFloat16},
                            {"float32", DType::kFloat32},
                            {"float64", DType::kFloat64},
                            {"int16", DType::kInt16},
                            {"int32", DType::kInt32},
                            {"int64", DType::kInt64},
                            {"int8", DType::kInt8},
                            {"uint8", DType::kUInt8}}) {
      t->dtypes.emplace_back(torch.attr(name), dt);
      t->names += t->names.empty() ? name : std::string(", ") + name;
    }
    return t;
  }();
  return *types;
}

bool IsTensor(py::handle v) {
  py::object mod = py::type::handle_of(v).attr("__module__");
  if (!PyUnicode_Check(mod.ptr())) return false;
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(mod.ptr(), &n);
  if (s == nullptr || !std::string_view(s, static_cast<size_t>(n)).starts_with("torch")) {
    return false;
  }
  return py::isinstance(v, Torch().tensor);
}

}  // namespace

std::vector<uint64_t> BatchIds(py::handle ids) {
  std::vector<uint64_t> out;
  if (PyList_Check(ids.ptr()) || PyTuple_Check(ids.ptr())) {
    PyObject* seq = ids.ptr();
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    out.resize(static_cast<size_t>(n));
    for (Py_ssize_t k = 0; k < n; ++k) {
      out[static_cast<size_t>(k)] = IdOf(PySequence_Fast_GET_ITEM(seq, k));
    }
    return out;
  }
  if (!py::isinstance<py::array>(ids)) {
    throw py::type_error("row ids are a list of ints or an integer array");
  }
  auto a = py::reinterpret_borrow<py::array>(ids);
  if (a.ndim() != 1) {
    throw py::value_error("ids must be one-dimensional, got shape " +
                          py::str(ids.attr("shape")).cast<std::string>());
  }
  char kind = a.dtype().kind();
  if (kind != 'u' && kind != 'i') {
    throw py::type_error("row ids are ints, got an array of " +
                         py::str(static_cast<py::object>(a.dtype())).cast<std::string>());
  }
  out.reserve(static_cast<size_t>(a.size()));
  switch (kind == 'u' ? a.itemsize() : -a.itemsize()) {
    case 1: CopyIds<uint8_t>(a, &out); break;
    case 2: CopyIds<uint16_t>(a, &out); break;
    case 4: CopyIds<uint32_t>(a, &out); break;
    case 8: CopyIds<uint64_t>(a, &out); break;
    case -1: CopyIds<int8_t>(a, &out); break;
    case -2: CopyIds<int16_t>(a, &out); break;
    case -4: CopyIds<int32_t>(a, &out); break;
    case -8: CopyIds<int64_t>(a, &out); break;
    default: break;
  }
  return out;
}

BatchTargets::BatchTargets(const std::vector<std::string>& names, const py::list& bufs,
                           size_t rows)
    : names_(names), shapes_(names.size()), cols_(names.size()) {
  if (bufs.size() != names_.size()) throw py::value_error("a name for every target");
  for (size_t t = 0; t < cols_.size(); ++t) {
    py::handle buf = bufs[t];
    if (py::isinstance<py::array>(buf)) {
      FromArray(t, buf);
    } else if (IsTensor(buf)) {
      FromTensor(t, buf);
    } else {
      throw py::type_error("column " + Repr(t) +
                           ": out holds numpy arrays or torch tensors, got " +
                           py::type::handle_of(buf).attr("__name__").cast<std::string>());
    }
    cols_[t].name = names_[t];
    if (shapes_[t].empty() || shapes_[t][0] < static_cast<int64_t>(rows)) {
      throw py::value_error(
          "column " + Repr(t) + ": the first dimension (" +
          (shapes_[t].empty() ? std::string("none") : std::to_string(shapes_[t][0])) +
          ") must hold the " + std::to_string(rows) + " ids");
    }
    shapes_[t].erase(shapes_[t].begin());
    size_t stride = DTypeSize(cols_[t].dtype);
    for (int64_t d : shapes_[t]) stride *= static_cast<size_t>(d);
    cols_[t].shape = shapes_[t];
    cols_[t].row_stride_bytes = stride;
  }
}

void BatchTargets::FromArray(size_t t, py::handle buf) {
  auto a = py::reinterpret_borrow<py::array>(buf);
  if (!(a.flags() & py::array::c_style) || !a.writeable()) {
    throw py::value_error("column " + Repr(t) +
                          ": the array must be C-contiguous and writable");
  }
  if (!IsNative(a.dtype())) {
    throw py::value_error("column " + Repr(t) +
                          ": the array is not in native byte order");
  }
  try {
    cols_[t].dtype = FromNumpy(a.dtype());
  } catch (const py::type_error& e) {
    throw py::type_error("column " + Repr(t) + ": " + e.what());
  }
  cols_[t].base = a.mutable_data();
  cols_[t].accept = Accept::kSameBytes;
  shapes_[t].assign(a.shape(), a.shape() + a.ndim());
}

void BatchTargets::FromTensor(size_t t, py::handle buf) {
  if (py::str(buf.attr("device").attr("type")).cast<std::string>() != "cpu" ||
      !buf.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error("column " + Repr(t) +
                          ": the tensor must be on the CPU and contiguous");
  }
  py::object dtype = buf.attr("dtype");
  const TorchTypes& torch = Torch();
  auto it = std::find_if(torch.dtypes.begin(), torch.dtypes.end(),
                         [&](const auto& d) { return d.first.is(dtype); });
  if (it == torch.dtypes.end()) {
    throw py::type_error("column " + Repr(t) + ": a cache column has no " +
                         py::str(dtype).cast<std::string>() + " (use one of " +
                         torch.names + ")");
  }
  cols_[t].dtype = it->second;
  // The tensor's memory comes as an int.
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  cols_[t].base = reinterpret_cast<void*>(buf.attr("data_ptr")().cast<uintptr_t>());
  cols_[t].accept = Accept::kTorch;
  for (py::handle d : buf.attr("shape")) shapes_[t].push_back(d.cast<int64_t>());
}

void BatchTargets::CheckStored(std::span<const StoredColumn> stored) const {
  for (size_t t = 0; t < cols_.size() && t < stored.size(); ++t) {
    if (cols_[t].accept == Accept::kTorch && stored[t].row != StoredColumn::kNoRow &&
        stored[t].dtype == DType::kBytes) {
      throw py::type_error("column " + Repr(t) +
                           " holds bytes, which have no torch dtype: read it into a "
                           "numpy uint8 array");
    }
  }
}

std::string BatchTargets::Repr(size_t t) const {
  return py::repr(py::str(names_[t])).cast<std::string>();
}

}  // namespace shmcache::python
