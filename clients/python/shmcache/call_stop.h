// stop_calls: a profile function of the calling thread that can refuse its
// calls of builtins (shmcache/torch/dataset_identity.py: an identity read
// given up stops at its next draw from the trainer's RNGs). sys.setprofile
// cannot: a profile function of Python's that raises is removed for good,
// and a dataset that catches the exception (a bare `except:`) then draws
// unstopped; and it runs Python at every call and return.
//
// Thread safety: needs the GIL; acts on the calling thread only. `armed`
// may be set by any thread (under the GIL).
#pragma once

#include <pybind11/pybind11.h>

#include "clients/python/shmcache/release_gil.h"

namespace shmcache::python {

namespace py = pybind11;

// Sets the calling thread's profile function: before each call of a
// builtin (a C function or method) from Python code of this thread, once
// the first byte of `armed` is not 0, it calls check(callable); an
// exception check raises is that call's, which does not run, and the
// profile function stays for the next calls. Unarmed, it reads that byte
// and nothing more. sys.getprofile() returns (check, armed);
// sys.setprofile(None) removes it. Calls from C code (a Cython function's
// own calls) are not seen.
void StopCalls(const py::object& check, const py::bytearray& armed) REQUIRES(g_gil);

}  // namespace shmcache::python
