// read_into's arguments made native: the ids of a batch and its target
// buffers (numpy arrays or torch tensors) as BatchReader's ColumnTargets,
// checked here, once, with the messages the package gives (TypeError /
// ValueError naming the column). Which stored dtypes a target takes is
// BatchReader's rule (batch_reader.h, Takes): a numpy array takes the same
// bytes (bfloat16 as uint16, bytes as uint8), a torch tensor the dtypes
// hits have as tensors (uint16 widened into int32, uint32/uint64 into
// int64).
//
// Thread safety: needs the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <span>
#include <string>
#include <vector>

#include "shmcache/batch_reader.h"

namespace shmcache::python {

namespace py = pybind11;

// The row ids of a list of ints or a 1-D integer numpy array, each checked
// (TypeError for a value that is not an int, ValueError for one outside
// [0, kMaxRowId] or an array that is not 1-D).
std::vector<uint64_t> BatchIds(py::handle ids);

class BatchTargets {
 public:
  // The targets of `names[t]` in `bufs[t]`, each holding at least `rows`
  // rows (its first dimension).
  BatchTargets(const std::vector<std::string>& names, const py::list& bufs, size_t rows);

  std::span<const ColumnTarget> columns() const { return cols_; }
  // TypeError when a tensor target's column is stored as bytes (no torch
  // dtype holds them), from what ReadInto saw.
  void CheckStored(std::span<const StoredColumn> stored) const;

 private:
  void FromArray(size_t t, py::handle buf);
  void FromTensor(size_t t, py::handle buf);
  std::string Repr(size_t t) const;

  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;  // per row (without the batch dim)
  std::vector<ColumnTarget> cols_;
};

}  // namespace shmcache::python
