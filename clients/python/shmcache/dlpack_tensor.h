// CPU tensors over buffers of our own, handed to torch through DLPack.
//
// Why: torch.from_numpy(array) of a row just copied costs a numpy array
// made and freed around the tensor, and a GIL taken to free it; a DLPack
// capsule over a buffer we allocate costs neither (docs/hit-path.md has
// the figures). The tensor owns the buffer: it is freed with the tensor's
// storage, from whatever thread drops it, without the GIL.
//
// Built only where dlpack/dlpack.h is (Debian: libdlpack-dev); without it
// NewTensor always answers nullopt and callers take torch.from_numpy.
//
// Thread safety: NewTensor needs the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <span>

#include "shmcache/types.h"

namespace shmcache::python {

struct OwnedTensor {
  pybind11::object tensor;
  void* data;  // nbytes writable bytes the tensor reads: fill before use
};

// A C-contiguous tensor of `t` and `shape` over a new, uninitialised
// buffer of `nbytes` (the product of shape and t's size), or nullopt when
// DLPack cannot carry `t` to this torch (bool, bytes; unsigned types wider
// than 8 bits, which torch 1.13 lacks) or was not built in. Throws what
// torch raises.
std::optional<OwnedTensor> NewTensor(DType t, std::span<const int64_t> shape,
                                     size_t nbytes);

}  // namespace shmcache::python
