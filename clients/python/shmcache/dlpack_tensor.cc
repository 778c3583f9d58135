#include "clients/python/shmcache/dlpack_tensor.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#ifdef SHMCACHE_HAVE_DLPACK
#include <dlpack/dlpack.h>
#endif

namespace shmcache::python {

#ifdef SHMCACHE_HAVE_DLPACK
namespace {

namespace py = pybind11;

// One allocation: the managed tensor, its shape and strides, then the
// data at a 64-byte boundary, as torch's own allocator aligns it. The
// block comes from malloc and is aligned here: aligned_alloc costs five
// times malloc in glibc (it carves the aligned chunk out of a larger one),
// as much as the rest of a small tensor's making (callgrind: 630 of about
// 2,700 instructions per tensor of a 3 KB hit).
constexpr size_t kAlign = 64;

void FreeBlock(DLManagedTensor* m) { std::free(m->manager_ctx); }

// A capsule torch never took (an exception between making and handing
// it over) still owns its block.
void CapsuleDestructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;  // torch took it
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m != nullptr) m->deleter(m);
}

bool TypeOf(DType t, DLDataType* out) {
  auto set = [&](uint8_t code, uint8_t bits) {
    *out = DLDataType{code, bits, 1};
    return true;
  };
  switch (t) {
    case DType::kInt8: return set(kDLInt, 8);
    case DType::kInt16: return set(kDLInt, 16);
    case DType::kInt32: return set(kDLInt, 32);
    case DType::kInt64: return set(kDLInt, 64);
    case DType::kUInt8: return set(kDLUInt, 8);
    case DType::kFloat16: return set(kDLFloat, 16);
    case DType::kFloat32: return set(kDLFloat, 32);
    case DType::kFloat64: return set(kDLFloat, 64);
    case DType::kBFloat16: return set(kDLBfloat, 16);
    case DType::kComplex64: return set(kDLComplex, 64);
    case DType::kComplex128: return set(kDLComplex, 128);
    default: return false;
  }
}

// The converter from a capsule: torch._C._from_dlpack, which the public
// torch.utils.dlpack.from_dlpack calls once its Python-level checks for
// objects with __dlpack__ are done. Those checks cost 0.4 us, a quarter
// of a 3 KB hit (docs/hit-path.md), and a capsule needs none of them; the
// public function where a torch lacks the name. Looked up once (leaked on
// purpose, as row_model.cc's other torch objects).
PyObject* FromDLPack() {
  static PyObject* f = [] {
    py::module_ c = py::module_::import("torch._C");
    py::object o = py::hasattr(c, "_from_dlpack")
                       ? c.attr("_from_dlpack")
                       : py::module_::import("torch.utils.dlpack").attr("from_dlpack");
    return o.release().ptr();
  }();
  return f;
}

}  // namespace

std::optional<OwnedTensor> NewTensor(DType t, std::span<const int64_t> shape,
                                     size_t nbytes) {
  DLDataType type;
  if (!TypeOf(t, &type)) return std::nullopt;
  size_t ndim = shape.size();
  size_t head = sizeof(DLManagedTensor) + 2 * ndim * sizeof(int64_t);
  void* mem = std::malloc(head + kAlign - 1 + nbytes);
  if (mem == nullptr) throw std::bad_alloc();
  auto* m = new (mem) DLManagedTensor;
  auto* dims = reinterpret_cast<int64_t*>(m + 1);
  int64_t* strides = dims + ndim;
  int64_t stride = 1;
  for (size_t i = ndim; i-- > 0;) {
    dims[i] = shape[i];
    strides[i] = stride;
    stride *= shape[i];
  }
  auto at = reinterpret_cast<uintptr_t>(mem) + head;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the aligned address in the block
  void* data = reinterpret_cast<void*>((at + kAlign - 1) / kAlign * kAlign);
  m->dl_tensor = DLTensor{
      data, DLDevice{kDLCPU, 0}, static_cast<int32_t>(ndim), type, dims, strides, 0};
  m->manager_ctx = mem;
  m->deleter = FreeBlock;
  PyObject* capsule = PyCapsule_New(m, "dltensor", CapsuleDestructor);
  if (capsule == nullptr) {
    std::free(mem);
    throw py::error_already_set();
  }
  auto owned = py::reinterpret_steal<py::object>(capsule);
  PyObject* made = PyObject_CallOneArg(FromDLPack(), capsule);
  if (made == nullptr) throw py::error_already_set();
  return OwnedTensor{py::reinterpret_steal<py::object>(made), data};
}

#else

std::optional<OwnedTensor> NewTensor(DType, std::span<const int64_t>, size_t) {
  return std::nullopt;
}

#endif

}  // namespace shmcache::python
