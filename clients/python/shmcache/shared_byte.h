// claim_byte: the one atomic step of WarnedFlag (shmcache/_warned_flag.py),
// whose bytes lie in a memfd mapped by a trainer and its DataLoader workers:
// Python has no compare-and-swap, and a read then a write lets two workers
// that meet one cause at the same instant both say the one warning.
//
// Thread safety: needs the GIL (it reads the buffer's object); the byte is
// claimed atomically against every thread and process that maps it.
#pragma once

#include <pybind11/pybind11.h>

#include "clients/python/shmcache/release_gil.h"

namespace shmcache::python {

namespace py = pybind11;

// Sets byte `offset` of the writable buffer `mapping` (an mmap) from 0 to 1
// in one atomic compare-and-swap; true for the call that set it, false when
// it was already set. IndexError for an offset outside the buffer.
bool ClaimByte(const py::buffer& mapping, py::ssize_t offset) REQUIRES(g_gil);

}  // namespace shmcache::python
