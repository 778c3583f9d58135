// ReleaseGil: py::gil_scoped_release for calls into the library, safe at
// interpreter exit (see the class). Shared by the extension's files.
#pragma once

#include <pybind11/pybind11.h>

#include <cxxabi.h>
#include <unistd.h>

#include "port/thread_annotations.h"

namespace shmcache::python {

// The main thread's ident: the thread that finalizes the interpreter.
// Set when the module is imported (_shmcache.cc).
inline unsigned long g_main_thread = 0;

inline bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// The GIL, as a capability the thread-safety analysis can name: state that
// only the GIL guards is GUARDED_BY(g_gil), and the functions that touch it
// (entered from Python, which holds the GIL) say REQUIRES(g_gil). Nothing
// is locked through it; ReleaseGil lets it go for its scope.
class CAPABILITY("GIL") Gil {};
inline Gil g_gil;

// py::gil_scoped_release for calls into the library. A call that may wait on
// the server (up to its request timeout) can return on a daemon thread (a
// background put) after the main thread began finalizing the interpreter,
// at exit: reacquiring the GIL would then end the thread with
// pthread_exit, whose unwinding through this destructor (noexcept) aborts
// the whole process ("terminate called without an active exception").
// Such a thread waits for the process to end instead: when it sees the
// finalization before it asks for the GIL, and when the finalization
// begins while it waits for the GIL (the check cannot close that window:
// the unwinding is caught, and a caught forced unwinding must never end).
class SCOPED_CAPABILITY ReleaseGil {
 public:
  ReleaseGil() RELEASE(g_gil) : state_(PyEval_SaveThread()) {}
  // Takes the GIL back (RELEASE ends the scope, which gave it up).
  ~ReleaseGil() RELEASE() {
    while (InterpreterFinalizing() && PyThread_get_thread_ident() != g_main_thread) {
      pause();
    }
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      for (;;) pause();
    }
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace shmcache::python
