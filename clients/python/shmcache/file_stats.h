// stat_files: the size and modification time of every file a dataset
// lists, for the default cache name (shmcache/dataset_identity.py). A
// dataset of a million files is stat'ed in a few hundred milliseconds:
// native, GIL released, several threads for long lists, each file by its
// name in its directory (fstatat(2) on the directory's O_PATH descriptor,
// held while consecutive entries share it and closed before returning):
// the result is stat(2)'s of the path, at a third less kernel time.
//
// Thread safety: needs the GIL (it releases it itself while stat-ing).
#pragma once

#include <pybind11/pybind11.h>

#include "clients/python/shmcache/release_gil.h"

namespace shmcache::python {

namespace py = pybind11;

// entries: a list (or tuple) of paths (str), or of tuples/lists whose first
// item is a path (as torchvision's DatasetFolder.samples). Returns bytes
// holding, per entry in order, two native int64: st_size and st_mtime in
// nanoseconds (stat(2), links followed), or -1, -1 where stat fails; None
// when an entry is neither (the list is not a file list).
py::object StatFiles(const py::handle& entries) REQUIRES(g_gil);

}  // namespace shmcache::python
