// stop_calls: a profile function of the calling thread that can refuse its
// calls of builtins (shmcache/torch/dataset_identity.py: an identity read
// given up stops at its next draw from the trainer's RNGs). sys.setprofile
// cannot: a profile function of Python's that raises is removed for good,
// and a dataset that catches the exception (a bare `except:`) then draws
// unstopped.
//
// Thread safety: needs the GIL; acts on the calling thread only.
#pragma once

#include <pybind11/pybind11.h>

#include "clients/python/shmcache/release_gil.h"

namespace shmcache::python {

namespace py = pybind11;

// Sets the calling thread's profile function to one that calls
// check(callable) before each call of a builtin (a C function or method)
// from Python code of this thread; an exception check raises is that
// call's, which does not run, and check stays set for the next calls.
// sys.getprofile() returns check; sys.setprofile(None) removes it. Calls
// from C code (a Cython function's own calls) are not seen.
void StopCalls(const py::object& check) REQUIRES(g_gil);

}  // namespace shmcache::python
