// _shmcache: the pybind11 binding of libshmcache, used by the `shmcache`
// Python package (see __init__.py for the user-facing API).
//
// Rows cross the boundary two ways: read / read_batch return them finished
// (a bare value, tuple or dict of numpy arrays or torch tensors, as put
// stored them), and get / get_batch as lists of (name, dtype_name, array)
// triples. Hits can be zero-copy: the arrays then point into shared memory
// (which this process maps read-only), are read-only numpy arrays, and hold
// a reference that keeps the Cache (and so its mappings) alive. The GIL is
// released around every call into the library that may wait (the daemon,
// large copies); a hit in memory is read with it held.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <bit>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "clients/python/shmcache/batch_targets.h"
#include "clients/python/shmcache/call_stop.h"
#include "clients/python/shmcache/file_stats.h"
#include "clients/python/shmcache/release_gil.h"
#include "clients/python/shmcache/row_model.h"
#include "clients/python/shmcache/shared_byte.h"
#include "format/layout.h"
#include "format/stats_fields.h"
#include "shmcache/batch_reader.h"
#include "shmcache/cache.h"
#include "shmcache/client.h"
#include "shmcache/options.h"
#include "shmcache/version.h"

namespace py = pybind11;
using shmcache::Cache;
using shmcache::Client;
using shmcache::ColumnRef;
using shmcache::ColumnView;
using shmcache::DType;
using shmcache::Status;
using shmcache::python::FromNumpy;
using shmcache::python::g_gil;
using shmcache::python::g_main_thread;
using shmcache::python::Leaf;
using shmcache::python::ParsedColumns;
using shmcache::python::ReleaseGil;
using shmcache::python::RowBuilder;
using shmcache::python::ToNumpy;

namespace {

// Tags of the Python exception types (py::register_exception wants one
// C++ type each); errors are raised through g_error_types.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct NotFoundError : Error {};
struct UnavailableError : Error {};
struct FullError : Error {};
struct FingerprintMismatchError : Error {};
struct InvalidArgumentError : Error {};
struct NotSupportedError : Error {};
struct TooLargeError : Error {};
struct AlreadyExistsError : Error {};
struct PermissionDeniedError : Error {};

// The Python exception type of each Status code (Error for codes Python
// does not tell apart), filled when the module is imported. The module
// holds the types, so plain handles suffice.
py::handle g_error_types[static_cast<size_t>(Status::Code::kTooLarge) + 1];

py::handle ErrorType(const Status& s) {
  py::handle t = g_error_types[static_cast<size_t>(s.code())];
  return t ? t : g_error_types[0];
}

// Why a cache is Full, as FullError.reason: "shm_filesystem" (no room in
// the shared-memory filesystem), "server_cap" (the server's memory cap is
// used up) or "budget" (the cache's own size), from the status's subcode.
const char* FullReason(const Status& s) {
  if (s.IsFullNoShmRoom()) return "shm_filesystem";
  if (s.IsFullServerCap()) return "server_cap";
  return "budget";
}

// The exception `s` raises, as an object: a batch reports a row's failure
// with it rather than raising.
py::object ExceptionOf(const Status& s) {
  py::object e = ErrorType(s)(s.ToString());
  if (s.IsFull()) e.attr("reason") = FullReason(s);
  return e;
}

[[noreturn]] void Throw(const Status& s) {
  py::object e = ExceptionOf(s);
  PyErr_SetObject(ErrorType(s).ptr(), e.ptr());
  throw py::error_already_set();
}

void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

void MakeReadOnly(py::array& a) {
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
}

// An array over `c`'s bytes. With `base` it is a view that keeps `base`
// alive (read-only unless `writable`); without, a private writable copy.
py::array ColumnToArray(const ColumnView& c, py::handle base, bool writable = false) {
  py::dtype dt = ToNumpy(c.dtype);
  std::vector<py::ssize_t> shape(c.shape.begin(), c.shape.end());
  if (base) {
    py::array a(dt, shape, {}, c.data, base);
    if (!writable) MakeReadOnly(a);
    return a;
  }
  py::array a(dt, shape);
  if (c.nbytes) std::memcpy(a.mutable_data(), c.data, c.nbytes);
  return a;
}

py::tuple ColumnTuple(const ColumnView& c, py::handle base, bool writable = false) {
  return py::make_tuple(py::str(c.name.data(), c.name.size()),
                        shmcache::DTypeName(c.dtype), ColumnToArray(c, base, writable));
}

// Every field of kStatFields by its name: ids and counters as int, flags
// as bool, the name as str (stats.py's CacheStats has the same fields).
py::dict StatsDict(const shmcache::CacheStats& st) {
  using shmcache::StatType;
  py::dict d;
  for (const shmcache::StatField& f : shmcache::kStatFields) {
    py::str key(f.name.data(), f.name.size());
    switch (f.type) {
      case StatType::kId: d[key] = st.*f.id; break;
      case StatType::kText: d[key] = st.*f.text; break;
      case StatType::kFlag: d[key] = st.*f.flag; break;
      case StatType::kCount:
      case StatType::kDerived: d[key] = f.Number(st); break;
    }
  }
  return d;
}

// The Python-side cache object. Shared ownership so that views can keep it
// alive after the Python object is gone.
struct PyCache {
  std::unique_ptr<Cache> cache;
  // BatchReaders not in use, each with the threads it was asked for (it
  // has fewer where the system refused some), guarded by the GIL: a caller
  // takes one (or makes one) and gives it back, so concurrent read_into
  // calls never share one, and fork() (which holds the GIL) never finds the
  // list half-changed. Declared after `cache`: destroyed (threads joined)
  // before it.
  std::vector<std::pair<int, std::unique_ptr<shmcache::BatchReader>>> idle_readers
      GUARDED_BY(g_gil);
  // Bytes of the columns read() and read_batch() handed out.
  uint64_t bytes_read GUARDED_BY(g_gil) = 0;
};
using PyCachePtr = std::shared_ptr<PyCache>;

// Capsule holding a reference to the cache, for zero-copy arrays' base.
py::capsule KeepAlive(const PyCachePtr& c) {
  auto* holder = new PyCachePtr(c);
  return py::capsule(holder, [](void* p) { delete static_cast<PyCachePtr*>(p); });
}

// Rows to put: the ColumnRefs over their parsed columns, one run for
// all rows.
struct PutRows {
  ParsedColumns columns;
  std::vector<ColumnRef> refs;
  std::vector<std::span<const ColumnRef>> rows;

  // Parses one more row's columns: a list (cast raises what it raised for
  // anything else).
  void Add(py::handle list) {
    if (PyList_Check(list.ptr())) {
      columns.AddRow(py::reinterpret_borrow<py::list>(list));
    } else {
      columns.AddRow(py::reinterpret_borrow<py::object>(list).cast<py::list>());
    }
  }
  // The refs of the rows added.
  void Finish() {
    refs.reserve(columns.arrays().size());
    rows.reserve(columns.num_rows());
    for (size_t r = 0; r < columns.num_rows(); ++r) {
      const size_t begin = refs.size();
      for (const ColumnView& c : columns.row(r)) {
        refs.push_back(ColumnRef{c.name, c.dtype, c.shape, c.data, c.nbytes});
      }
      rows.emplace_back(refs.data() + begin, refs.size() - begin);
    }
  }
};

// put(id, [(name, dtype_name_or_None, array), ...]) -> inserted
bool Put(PyCache& self, uint64_t id, const py::list& columns) REQUIRES(g_gil) {
  PutRows row;
  row.Add(columns);
  row.Finish();
  bool inserted = false;
  Status s;
  {
    ReleaseGil nogil;
    s = self.cache->Put(id, row.rows[0], &inserted);
  }
  Check(s);
  return inserted;
}

// put_batch(ids, [columns, ...]) -> ([inserted per row], [(index, error)]):
// a row that failed is False in the first list and has in the second the
// exception put would have raised for it (an object, not raised). The
// rows are copied into shared memory without the GIL; the arrays stay
// alive meanwhile (PutRows::columns).
py::tuple PutBatch(PyCache& self, const std::vector<uint64_t>& ids, const py::list& rows)
    REQUIRES(g_gil) {
  if (rows.size() != ids.size()) {
    throw py::value_error("put_batch: " + std::to_string(ids.size()) + " ids but " +
                          std::to_string(rows.size()) + " rows");
  }
  PutRows parsed;
  parsed.columns.Reserve(ids.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    // A column's conversion may run Python code (an __array__) that
    // changes the list: its items are read with their bound checked.
    if (static_cast<size_t>(PyList_GET_SIZE(rows.ptr())) <= i) {
      throw py::value_error("put_batch: the rows list changed while it was read");
    }
    parsed.Add(py::reinterpret_borrow<py::object>(PyList_GET_ITEM(rows.ptr(), i)));
  }
  parsed.Finish();
  std::vector<Status> statuses(ids.size());
  std::unique_ptr<bool[]> inserted(new bool[ids.size()]);
  {
    ReleaseGil nogil;
    self.cache
        ->PutBatch(ids, parsed.rows, statuses, std::span(inserted.get(), ids.size()))
        .PermitUncheckedError();  // in every statuses[i] too
  }
  py::list out(ids.size());
  py::list errors;
  for (size_t i = 0; i < ids.size(); ++i) {
    out[i] = py::bool_(statuses[i].ok() && inserted[i]);
    if (!statuses[i].ok()) errors.append(py::make_tuple(i, ExceptionOf(statuses[i])));
  }
  return py::make_tuple(out, errors);
}

// A private copy of a row (Cache::Get's Row), owned by the arrays over it:
// copy-out costs one copy, from shared memory into the Row.
py::capsule OwnRow(shmcache::Row&& row) {
  auto* holder = new shmcache::Row(std::move(row));
  return py::capsule(holder, [](void* p) { delete static_cast<shmcache::Row*>(p); });
}

// [(name, dtype, array)] over a private Row (writable arrays, no copy).
// The columns of row `id` (all, or the ones `names` names by key, in that
// order: KeyError for one it lacks), as arrays over the row they own.
py::list RowColumns(shmcache::Row&& row, uint64_t id = 0,
                    const std::vector<std::string>* names = nullptr) {
  py::list out;
  if (row.num_columns() == 0 && names == nullptr) return out;
  py::capsule base = OwnRow(std::move(row));
  const auto* keep = static_cast<const shmcache::Row*>(base.get_pointer());
  for (const ColumnView& c : shmcache::python::SelectColumns(id, keep->view(), names)) {
    out.append(ColumnTuple(c, base, /*writable=*/true));
  }
  return out;
}

// The columns of `view` (all, or the named ones in that order), as
// zero-copy arrays over shared memory, or as copies when the view might
// point into the per-thread spill buffer.
py::list ViewColumns(const PyCachePtr& self, uint64_t id, const shmcache::RowView& view,
                     const std::optional<std::vector<std::string>>& columns,
                     bool readonly) {
  // A spilled row's view points into a per-thread buffer that the next view
  // of a spilled row overwrites: such rows are copied, never viewed.
  bool zero_copy = view.in_shared_memory();
  py::object base = zero_copy ? py::object(KeepAlive(self)) : py::object();
  py::list out;
  if (columns) {
    // By key: a tagged column (a PIL image's, a number's) answers its name.
    for (const ColumnView& c : shmcache::python::SelectColumns(id, view, &*columns)) {
      out.append(ColumnTuple(c, base, !readonly));
    }
  } else {
    for (size_t i = 0; i < view.num_columns(); ++i) {
      out.append(ColumnTuple(view.column(i), base, !readonly));
    }
  }
  return out;
}

// get(id, columns=None, copy=True, readonly=True)
//   -> [(name, dtype, array)] or None.
// copy=False: zero-copy arrays over shared memory, read-only unless
// readonly=False (for callers that wrap them in tensors and never write).
py::object Get(const PyCachePtr& self, uint64_t id,
               std::optional<std::vector<std::string>> columns, bool copy, bool readonly)
    REQUIRES(g_gil) {
  if (copy) {
    shmcache::Row row;
    Status s;
    {
      ReleaseGil nogil;
      if (columns) {
        std::vector<std::string_view> names(columns->begin(), columns->end());
        s = self->cache->Get(id, names, &row);
      } else {
        s = self->cache->Get(id, &row);
      }
    }
    if (s.IsColumnNotFound()) {
      // A tagged column (a Python number's, a PIL image's) answers its
      // plain name, which the library's projection does not know: the
      // whole row, then its columns by key (KeyError for one it lacks: a
      // missing column of a present row is the caller's mistake).
      {
        ReleaseGil nogil;
        s = self->cache->Get(id, &row);
      }
      if (s.IsNotFound()) return py::none();
      Check(s);
      return RowColumns(std::move(row), id, &*columns);
    }
    if (s.IsNotFound()) return py::none();
    Check(s);
    return RowColumns(std::move(row));
  }
  shmcache::RowView view;
  Status s;
  {
    ReleaseGil nogil;
    s = self->cache->View(id, &view);
  }
  if (s.IsNotFound()) return py::none();
  Check(s);
  return ViewColumns(self, id, view, columns, readonly);
}

// get_batch(ids, copy=True, readonly=True, count=True) -> [columns or None
// per id]. copy=True uses Cache::GetBatch: spilled rows are read by this
// process from the spill database, one MultiGet per batch (cache.h);
// count=False uses GetBatchUncounted (reads counted already). copy=False
// views rows in shared memory; spilled rows are then copied one by one.
py::list GetBatch(const PyCachePtr& self, const std::vector<uint64_t>& ids, bool copy,
                  bool readonly, bool count) REQUIRES(g_gil) {
  py::list out;
  if (!count && !copy) throw py::value_error("get_batch: count=False needs copy=True");
  if (copy) {
    std::vector<shmcache::Row> rows(ids.size());
    std::vector<Status> statuses(ids.size());
    Status s;
    {
      ReleaseGil nogil;
      s = count ? self->cache->GetBatch(ids, rows, statuses)
                : self->cache->GetBatchUncounted(ids, rows, statuses);
    }
    Check(s);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (statuses[i].IsNotFound()) {
        out.append(py::none());
        continue;
      }
      Check(statuses[i]);
      out.append(RowColumns(std::move(rows[i])));
    }
    return out;
  }
  for (uint64_t id : ids) out.append(Get(self, id, std::nullopt, false, readonly));
  return out;
}

// Views of rows ids[i]: memory rows from ViewBatch, with the GIL held (no
// system call on a hit); rows on disk are fetched into *disk with one
// GetBatch, without the GIL, and viewed there. statuses[i] as GetBatch's.
void ViewRows(Cache& cache, std::span<const uint64_t> ids,
              std::span<shmcache::RowView> views, std::span<Status> statuses,
              std::vector<shmcache::Row>* disk) REQUIRES(g_gil) {
  Check(cache.ViewBatch(ids, views, statuses));
  std::vector<uint64_t> spilled;
  std::vector<size_t> where;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (statuses[i].IsNotSupported()) {
      spilled.push_back(ids[i]);
      where.push_back(i);
    }
  }
  if (spilled.empty()) return;
  disk->resize(spilled.size());
  std::vector<Status> got(spilled.size());
  Status s;
  {
    ReleaseGil nogil;
    s = cache.GetBatch(spilled, *disk, got);
  }
  Check(s);
  for (size_t k = 0; k < where.size(); ++k) {
    statuses[where[k]] = std::move(got[k]);
    views[where[k]] = (*disk)[k].view();
  }
}

// The view of row `id` into *view (a spilled row is fetched into *disk,
// without the GIL); false on a miss.
bool ViewOne(Cache& cache, uint64_t id, shmcache::RowView* view, shmcache::Row* disk)
    REQUIRES(g_gil) {
  Status status;
  Check(cache.ViewBatch(std::span(&id, 1), std::span(view, 1), std::span(&status, 1)));
  if (status.IsNotSupported()) {
    Status s;
    {
      ReleaseGil nogil;
      s = cache.GetBatch(std::span(&id, 1), std::span(disk, 1), std::span(&status, 1));
    }
    Check(s);
    *view = disk->view();
  }
  if (status.IsNotFound()) return false;
  Check(status);
  return true;
}

// The sample of `cols`, as RowBuilder builds it; counts its bytes.
py::object BuildRow(PyCache& self, py::handle owner, const shmcache::RowView& view,
                    std::span<const ColumnView> cols, bool copy, bool torch, bool single)
    REQUIRES(g_gil) {
  // Small rows (the per-sample path) build without a heap allocation.
  constexpr size_t kInline = 8;
  py::handle inline_bases[kInline];
  std::vector<py::handle> many;
  std::span<py::handle> bases(inline_bases, cols.size());
  if (cols.size() > kInline) {
    many.resize(cols.size());
    bases = many;
  }
  std::fill(bases.begin(), bases.end(), view.in_shared_memory() ? owner : py::handle());
  RowBuilder b(torch ? Leaf::kTorch : Leaf::kNumpy, !copy);
  py::object row = b.Build(cols, bases, single);
  b.Copy();
  self.bytes_read += b.bytes();
  return row;
}

// The PyCache of `owner`, a Cache instance (read's method descriptor has
// checked its type). pybind11's cast looks the type up each time; an
// instance of simple layout holds the value pointer itself.
PyCache& SelfOf(py::handle owner) {
  auto* inst = reinterpret_cast<py::detail::instance*>(owner.ptr());
  if (inst->simple_layout && inst->simple_holder_constructed &&
      inst->simple_value_holder[0] != nullptr) {
    return *static_cast<PyCache*>(inst->simple_value_holder[0]);
  }
  return owner.cast<PyCache&>();
}

// read(id, copy=True, torch=False) -> row or None
py::object Read(py::handle owner, uint64_t id, bool copy, bool torch) REQUIRES(g_gil) {
  PyCache& self = SelfOf(owner);
  shmcache::RowView view;
  shmcache::Row disk;
  if (!ViewOne(*self.cache, id, &view, &disk)) return py::none();
  constexpr size_t kInline = 8;
  size_t n = view.num_columns();
  if (n > kInline) {
    std::vector<ColumnView> cols = shmcache::python::SelectColumns(id, view, nullptr);
    return BuildRow(self, owner, view, cols, copy, torch, false);
  }
  ColumnView cols[kInline];
  for (size_t i = 0; i < n; ++i) cols[i] = view.column(i);
  return BuildRow(self, owner, view, std::span(cols, n), copy, torch, false);
}

// read's entry point, without pybind11's dispatcher (most of the binding's
// cost of a small hit): read(id, copy, torch), all positional.
PyObject* ReadFast(PyObject* owner, PyObject* const* args, Py_ssize_t nargs)
    REQUIRES(g_gil) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError,
                    "read(id, copy, torch) takes 3 positional arguments");
    return nullptr;
  }
  // The id's range is checked here, so that the Python callers need check
  // only its type: ValueError as DatasetCache._check_id raises it.
  unsigned long long id = PyLong_AsUnsignedLongLong(args[0]);
  if ((id == static_cast<unsigned long long>(-1) && PyErr_Occurred()) ||
      id > shmcache::kMaxRowId) {
    if (!PyLong_Check(args[0])) return nullptr;  // not an int: its TypeError
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "row id %S outside [0, %llu]", args[0],
                 static_cast<unsigned long long>(shmcache::kMaxRowId));
    return nullptr;
  }
  int copy = PyObject_IsTrue(args[1]);
  int torch = PyObject_IsTrue(args[2]);
  if (copy < 0 || torch < 0) return nullptr;
  try {
    return Read(py::handle(owner), id, copy != 0, torch != 0).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

// read_columns(id, columns, copy=True, torch=False, single=False)
//   -> the named columns of the row (single: the one column's value), or
//   None on a miss; KeyError naming a column the row lacks.
py::object ReadColumns(py::handle owner, uint64_t id,
                       const std::vector<std::string>& columns, bool copy, bool torch,
                       bool single) REQUIRES(g_gil) {
  PyCache& self = owner.cast<PyCache&>();
  shmcache::RowView view;
  shmcache::Row disk;
  if (!ViewOne(*self.cache, id, &view, &disk)) return py::none();
  std::vector<ColumnView> cols = shmcache::python::SelectColumns(id, view, &columns);
  return BuildRow(self, owner, view, cols, copy, torch, single);
}

// read_batch(ids, copy=True, torch=False) -> [row or None per id]
py::list ReadBatch(py::handle owner, const std::vector<uint64_t>& ids, bool copy,
                   bool torch) REQUIRES(g_gil) {
  PyCache& self = owner.cast<PyCache&>();
  std::vector<shmcache::RowView> views(ids.size());
  std::vector<Status> statuses(ids.size());
  std::vector<shmcache::Row> disk;
  ViewRows(*self.cache, ids, views, statuses, &disk);
  RowBuilder b(torch ? Leaf::kTorch : Leaf::kNumpy, !copy);
  py::list out(ids.size());
  std::vector<py::handle> bases;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (statuses[i].IsNotFound()) {
      out[i] = py::none();
      continue;
    }
    Check(statuses[i]);
    std::vector<ColumnView> cols =
        shmcache::python::SelectColumns(ids[i], views[i], nullptr);
    bases.assign(cols.size(), views[i].in_shared_memory() ? owner : py::handle());
    out[i] = b.Build(cols, bases, false);
  }
  b.Copy();
  self.bytes_read += b.bytes();
  return out;
}

// read_into(ids, names, bufs, threads, codes, count): copies rows ids[i] into row
// i of bufs[t] (numpy arrays or torch tensors; column names[t]), with
// BatchReader's rule (batch_targets.h); returns the hit mask (bool), or
// with codes the per-row kRowMissing / kRowRead / kRowOtherLayout (uint8).
// One call per batch: the targets are checked, the rows found, matched,
// copied (widened where a tensor's dtype is wider) and counted, once each,
// with the GIL released from the lookup to the last copy; count=false
// counts nothing (a loader's read-back of rows its workers stored).
py::array ReadInto(PyCache& self, py::handle ids, const std::vector<std::string>& names,
                   const py::list& bufs, int threads, bool codes, bool count)
    REQUIRES(g_gil) {
  std::vector<uint64_t> id_list = shmcache::python::BatchIds(ids);
  const size_t n = id_list.size();
  shmcache::python::BatchTargets targets(names, bufs, n);
  // The codes are written into the array returned: as bool, each is made
  // 0 or 1 after the read.
  py::array hit(codes ? py::dtype::of<uint8_t>() : py::dtype::of<bool>(),
                std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
  if (n == 0) return hit;
  auto* h = static_cast<uint8_t*>(hit.mutable_data());
  std::unique_ptr<shmcache::BatchReader> reader;
  threads = std::max(threads, 1);
  // self.idle_readers spelt out each time (no reference to it): the
  // analysis checks every use against the GIL.
  for (size_t k = self.idle_readers.size(); k-- > 0;) {
    if (self.idle_readers[k].first == threads) {
      reader = std::move(self.idle_readers[k].second);
      self.idle_readers.erase(self.idle_readers.begin() + static_cast<std::ptrdiff_t>(k));
      break;
    }
  }
  if (!reader)
    reader = std::make_unique<shmcache::BatchReader>(self.cache.get(), threads);
  std::vector<shmcache::StoredColumn> stored(names.size());
  Status s;
  {
    ReleaseGil nogil;
    s = reader->ReadInto(id_list, targets.columns(), std::span(h, n), stored, count);
  }
  self.idle_readers.emplace_back(threads, std::move(reader));
  Check(s);
  targets.CheckStored(stored);
  if (!codes) {
    for (size_t i = 0; i < n; ++i) h[i] = h[i] == shmcache::kRowRead ? 1 : 0;
  }
  return hit;
}

}  // namespace

PYBIND11_MODULE(_shmcache, m) {
  m.doc() = "Binding of libshmcache; use the `shmcache` package instead.";
  g_main_thread = py::module_::import("threading")
                      .attr("main_thread")()
                      .attr("ident")
                      .cast<unsigned long>();
  namespace rows = shmcache::python;
  // The constants the package checks arguments against, from the C++
  // headers that define them (Python copies none).
  m.attr("__version__") = std::to_string(shmcache::kMajorVersion) + "." +
                          std::to_string(shmcache::kMinorVersion) + "." +
                          std::to_string(shmcache::kPatchVersion);
  m.attr("MAX_ROW_ID") = shmcache::kMaxRowId;
  m.attr("MIN_PORT") = shmcache::kMinPort;
  m.attr("MAX_PORT") = shmcache::kMaxPort;
  m.attr("DEFAULT_PORT") = shmcache::kDefaultPort;
  m.attr("MAX_NAME_BYTES") = shmcache::kMaxNameBytes;
  {
    py::list names;
    for (const shmcache::StatField& f : shmcache::kStatFields) {
      names.append(py::str(f.name.data(), f.name.size()));
    }
    m.attr("STAT_FIELDS") = py::tuple(names);
  }
  m.attr("MAX_COLUMNS") = shmcache::kMaxColumnsPerRow;
  m.attr("LOCAL_HOSTS") = py::make_tuple("127.0.0.1", "localhost", "::1");
  m.attr("NUMBER_TAG") = std::string(shmcache::python::kNumberTag);
  m.attr("ROW_FORMAT") = shmcache::python::kRowFormat;
  m.attr("DTYPES") = rows::DTypeTable();
  // What read_into(codes=True) says of each row (batch_reader.h).
  m.attr("ROW_MISSING") = shmcache::kRowMissing;
  m.attr("ROW_READ") = shmcache::kRowRead;
  m.attr("ROW_OTHER_LAYOUT") = shmcache::kRowOtherLayout;
  // A segment file's header, which CachePages reads in the mapping
  // (torch/_cache_pages.py): its magic first, and where its carve mark is.
  namespace layout = shmcache::layout;
  static_assert(std::is_standard_layout_v<layout::SegmentHeader>);
  static_assert(offsetof(layout::SegmentHeader, file) == 0 &&
                offsetof(layout::FileHeader, magic) == 0);
  m.attr("SEGMENT_MAGIC") = layout::kSegmentMagic;
  m.attr("SEGMENT_HEADER_BYTES") = layout::kSegmentHeaderSize;
  m.attr("SEGMENT_CARVED_AT") = offsetof(layout::SegmentHeader, carved);
  m.def("encode", &rows::Encode, py::arg("sample"),
        "The columns [(name, dtype, array)] that store `sample`.");
  m.def("encode_all", &rows::EncodeAll, py::arg("samples"),
        "[encode(s) for s in samples], in one call.");
  m.def("decode", &rows::Decode, py::arg("columns"), py::arg("torch") = false,
        "The sample a hit of `columns` is (tensors when torch).");
  m.def("stat_files", &shmcache::python::StatFiles, py::arg("entries"),
        "Per path (or (path, ...) entry): st_size and st_mtime_ns as native "
        "int64 pairs in bytes, -1 where stat fails; None for no file list.");
  m.def("stop_calls", &shmcache::python::StopCalls, py::arg("check"), py::arg("armed"),
        "Once armed[0] is set, calls check(callable) before each call of a "
        "builtin on this thread; what check raises stops that call, and the "
        "stop stays (call_stop.h).");
  m.def("claim_byte", &shmcache::python::ClaimByte, py::arg("mapping"), py::arg("offset"),
        "Sets byte `offset` of a writable buffer from 0 to 1 atomically (compare-"
        "and-swap); True for the call that set it.");
  m.def(
      "split_name",
      [](const std::string& name) {
        return py::make_tuple(std::string(rows::KeyOf(name)),
                              std::string(rows::TagOf(name)));
      },
      py::arg("name"),
      "(key, tag) of a stored column name: the tag is a PIL image's mode, else \"\".");
  m.def(
      "row_kind",
      [](const std::vector<std::string>& names) {
        std::vector<std::string_view> keys;
        keys.reserve(names.size());
        for (const std::string& n : names) keys.push_back(rows::KeyOf(n));
        return rows::KindName(rows::KindOf(keys));
      },
      py::arg("names"),
      "\"value\", \"tuple\" or \"dict\": what a row of these columns is.");
  // Translators run newest first: the base class is registered first.
  auto& error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  using Code = Status::Code;
  auto type = [&](Code c, py::handle t) { g_error_types[static_cast<size_t>(c)] = t; };
  type(Code::kOk, error);  // the fallback for the codes not named below
  type(Code::kNotFound,
       py::register_exception<NotFoundError>(m, "NotFoundError", error.ptr()));
  type(Code::kUnavailable,
       py::register_exception<UnavailableError>(m, "UnavailableError", error.ptr()));
  type(Code::kFull, py::register_exception<FullError>(m, "FullError", error.ptr()));
  type(Code::kFingerprintMismatch, py::register_exception<FingerprintMismatchError>(
                                       m, "FingerprintMismatchError", error.ptr()));
  type(Code::kInvalidArgument, py::register_exception<InvalidArgumentError>(
                                   m, "InvalidArgumentError", error.ptr()));
  type(Code::kNotSupported,
       py::register_exception<NotSupportedError>(m, "NotSupportedError", error.ptr()));
  type(Code::kTooLarge,
       py::register_exception<TooLargeError>(m, "TooLargeError", error.ptr()));
  type(Code::kAlreadyExists,
       py::register_exception<AlreadyExistsError>(m, "AlreadyExistsError", error.ptr()));
  type(Code::kPermissionDenied, py::register_exception<PermissionDeniedError>(
                                    m, "PermissionDeniedError", error.ptr()));

  py::class_<PyCache, PyCachePtr> cache_class(m, "Cache");
  cache_class
      .def("put", &Put, py::arg("id"), py::arg("columns"),
           "Stores a row; returns False when the id was already present.")
      .def("put_batch", &PutBatch, py::arg("ids"), py::arg("rows"),
           "Stores rows[i] under ids[i]: ([inserted per row], [(index, "
           "exception put would raise)]).")
      .def("get", &Get, py::arg("id"), py::arg("columns") = py::none(),
           py::arg("copy") = true, py::arg("readonly") = true,
           "A list of (name, dtype, array), or None on a miss.")
      .def("get_batch", &GetBatch, py::arg("ids"), py::arg("copy") = true,
           py::arg("readonly") = true, py::arg("count") = true,
           "For each id, a list of (name, dtype, array) or None on a miss; "
           "count=False (with copy=True): counted neither as hits nor misses.")
      .def("read_columns", &ReadColumns, py::arg("id"), py::arg("columns"),
           py::arg("copy") = true, py::arg("torch") = false, py::arg("single") = false,
           "The named columns of the row (single: the one column's value), or None.")
      .def("read_batch", &ReadBatch, py::arg("ids"), py::arg("copy") = true,
           py::arg("torch") = false, "[row or None per id].")
      .def_property_readonly(
          "bytes_read", [](PyCache& self) REQUIRES(g_gil) { return self.bytes_read; },
          "Bytes of the columns read and read_batch returned.")
      .def_property_readonly(
          "rows_dropped",
          [](PyCache& self) REQUIRES(g_gil) { return self.cache->SpilledRowsDropped(); },
          "Spilled rows this object's reads found failing their check, which the "
          "server dropped (each a miss): Cache::SpilledRowsDropped.")
      .def("read_into", &ReadInto, py::arg("ids"), py::arg("names"), py::arg("bufs"),
           py::arg("threads"), py::arg("codes") = false, py::arg("count") = true,
           "Copies rows ids[i] into row i of bufs (arrays or tensors of columns "
           "names); the hit mask, or with codes each row's ReadInto code. "
           "count=False: counted neither as hits nor misses.")
      .def("contains",
           [](PyCache& self, uint64_t id) REQUIRES(g_gil) {
             ReleaseGil nogil;
             return self.cache->Contains(id);
           })
      .def("stats",
           [](PyCache& self) {
             shmcache::CacheStats st;
             Check(self.cache->GetStats(&st));
             return StatsDict(st);
           })
      .def("is_full", [](PyCache& self) { return self.cache->IsFull(); })
      .def(
          "claim_build",
          [](PyCache& self) REQUIRES(g_gil) {
            bool claimed = false;
            Status s;
            {
              ReleaseGil nogil;
              s = self.cache->ClaimBuild(&claimed);
            }
            Check(s);
            return claimed;
          },
          "Claims the build of a streaming cache: True for the first caller only.")
      .def(
          "seal",
          [](PyCache& self, uint64_t num_rows) REQUIRES(g_gil) {
            Status s;
            {
              ReleaseGil nogil;
              s = self.cache->Seal(num_rows);
            }
            Check(s);
          },
          py::arg("num_rows"),
          "Seals the cache as holding rows 0..num_rows-1 (the first seal wins).")
      .def(
          "sealed_rows",
          [](PyCache& self) REQUIRES(g_gil) -> std::optional<uint64_t> {
            uint64_t n = 0;
            Status s;
            bool unsealed = false;
            {
              ReleaseGil nogil;
              s = self.cache->GetSealedRows(&n);
              if (s.IsNotFound()) {
                // Not sealed, or its session destroyed (NotFound too, which
                // GetStats tells apart): only the first is None.
                shmcache::CacheStats unused;
                Status usable = self.cache->GetStats(&unused);
                unsealed = usable.ok();
                if (!unsealed) s = usable;
              }
            }
            if (unsealed) return std::nullopt;
            Check(s);
            return n;
          },
          "The row count the cache was sealed with, or None while it is not sealed; "
          "NotFoundError once its session was destroyed.")
      .def_property_readonly("cache_id",
                             [](PyCache& self) { return self.cache->cache_id(); })
      .def_property_readonly("session_id",
                             [](PyCache& self) { return self.cache->session_id(); })
      .def("close", [](PyCache& self) REQUIRES(g_gil) {
        ReleaseGil nogil;
        self.cache->Close();
      });

  static PyMethodDef read_def = {
      "read", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&ReadFast)),
      METH_FASTCALL,
      "read(id, copy, torch): the row as put stored it, or None on a miss."};
  py::object read = py::reinterpret_steal<py::object>(
      PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cache_class.ptr()), &read_def));
  if (!read) throw py::error_already_set();
  cache_class.attr("read") = read;

  py::class_<Client, std::shared_ptr<Client>>(m, "Client")
      .def(py::init([](int port, const std::string& hostname, const std::string& run_dir,
                       int timeout_ms) REQUIRES(g_gil) {
             shmcache::ClientOptions o;
             o.port = port;
             o.hostname = hostname;
             o.run_dir = run_dir;
             o.request_timeout_ms = timeout_ms;
             std::unique_ptr<Client> c;
             Status s;
             {
               ReleaseGil nogil;
               s = Client::Connect(o, &c);
             }
             Check(s);
             return std::shared_ptr<Client>(std::move(c));
           }),
           py::arg("port") = 0, py::arg("hostname") = "", py::arg("run_dir") = "",
           py::arg("timeout_ms") = 5000)
      .def("create_session",
           [](Client& c) {
             uint32_t id = 0;
             Check(c.CreateSession(&id));
             return id;
           })
      .def("destroy_session", [](Client& c, uint32_t id) { Check(c.DestroySession(id)); })
      .def("check_session", [](Client& c, uint32_t id) { Check(c.CheckSession(id)); })
      .def(
          "open_cache",
          [](Client& c, uint32_t session_id, const std::string& name,
             const std::string& fingerprint, uint64_t size_mb, bool spill_requested)
              REQUIRES(g_gil) {
                shmcache::CacheOptions o;
                o.session_id = session_id;
                o.name = name;
                o.fingerprint = fingerprint;
                o.size_mb = size_mb;
                o.spill_requested = spill_requested;
                auto out = std::make_shared<PyCache>();
                Status s;
                {
                  ReleaseGil nogil;
                  s = c.OpenCache(o, &out->cache);
                }
                Check(s);
                return out;
              },
          py::arg("session_id"), py::arg("name"), py::arg("fingerprint"),
          py::arg("size_mb") = 0, py::arg("spill_requested") = false)
      .def("list_sessions",
           [](Client& c) {
             std::vector<shmcache::SessionInfo> sessions;
             Check(c.ListSessions(&sessions));
             py::list out;
             for (const auto& s : sessions) {
               py::list caches;
               for (const auto& st : s.caches) caches.append(StatsDict(st));
               py::dict d;
               d["session_id"] = s.session_id;
               d["caches"] = caches;
               out.append(d);
             }
             return out;
           })
      .def("server_info",
           [](Client& c) {
             shmcache::ServerInfo i;
             Check(c.GetServerInfo(&i));
             py::dict d;
             d["instance"] = i.instance;
             d["port"] = i.port;
             d["socket_path"] = i.socket_path;
             d["shm_dir"] = i.shm_dir;
             d["shm_huge_pages"] = i.shm_huge_pages;
             d["shm_pages"] = i.shm_pages;
             d["pid"] = i.pid;
             d["workers"] = i.workers;
             d["log_level"] = i.log_level;
             d["log_path"] = i.log_path;
             d["spill_dir"] = i.spill_dir;
             d["memory_cap_bytes"] = i.memory_cap_bytes;
             d["memory_used_bytes"] = i.memory_used_bytes;
             d["memory_held_bytes"] = i.memory_held_bytes;
             d["memory_cap_bound"] = i.memory_cap_bound;
             d["memory_requested_bound"] = i.memory_requested_bound;
             d["memory_requested_bytes"] = i.memory_requested_bytes;
             d["memory_cgroup_bytes"] = i.memory_cgroup_bytes;
             d["memory_cgroup_limit_bytes"] = i.memory_cgroup_limit_bytes;
             d["memory_shm_bytes"] = i.memory_shm_bytes;
             d["numa_nodes"] = i.numa_nodes;
             d["sessions"] = i.sessions;
             d["connections"] = i.connections;
             d["start_time_unix"] = i.start_time_unix;
             d["uptime_seconds"] = i.uptime_seconds;
             return d;
           })
      .def("stop_server", [](Client& c) { Check(c.StopServer()); });
}
