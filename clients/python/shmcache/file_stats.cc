#include "clients/python/shmcache/file_stats.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace shmcache::python {
namespace {

// Files per thread: below this, starting a thread costs more than it saves.
constexpr size_t kFilesPerThread = 512;
constexpr size_t kMaxThreads = 8;

void StatRange(const std::vector<const char*>& paths, size_t from, size_t to,
               int64_t* out) {
  for (size_t i = from; i < to; ++i) {
    struct stat st {};
    if (::stat(paths[i], &st) == 0) {
      out[2 * i] = static_cast<int64_t>(st.st_size);
      out[2 * i + 1] = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
                       static_cast<int64_t>(st.st_mtim.tv_nsec);
    } else {
      out[2 * i] = out[2 * i + 1] = -1;
    }
  }
}

}  // namespace

py::object StatFiles(const py::handle& entries) {
  if (!PyList_Check(entries.ptr()) && !PyTuple_Check(entries.ptr())) return py::none();
  py::sequence seq = py::reinterpret_borrow<py::sequence>(entries);
  size_t n = seq.size();
  // The str objects stay referenced (the list may change once the GIL is
  // released); their UTF-8 buffers live as long as they do.
  std::vector<py::object> keep;
  std::vector<const char*> paths;
  keep.reserve(n);
  paths.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    py::object e = seq[i];
    if ((PyTuple_Check(e.ptr()) || PyList_Check(e.ptr())) && py::len(e) > 0) {
      e = py::reinterpret_borrow<py::sequence>(e)[0];
    }
    if (!PyUnicode_Check(e.ptr())) return py::none();
    Py_ssize_t len = 0;
    const char* s = PyUnicode_AsUTF8AndSize(e.ptr(), &len);
    if (s == nullptr) throw py::error_already_set();
    if (std::char_traits<char>::length(s) != static_cast<size_t>(len)) {
      return py::none();  // a NUL inside: no path
    }
    paths.push_back(s);
    keep.push_back(std::move(e));
  }
  std::vector<int64_t> out(2 * n);
  {
    ReleaseGil nogil;
    size_t cpus = std::max(1u, std::thread::hardware_concurrency());
    size_t threads =
        std::clamp<size_t>(n / kFilesPerThread, 1, std::min(kMaxThreads, cpus));
    std::vector<std::thread> pool;
    pool.reserve(threads);  // no reallocation once threads run
    size_t per = (n + threads - 1) / threads;
    size_t taken = std::min(n, per);  // rows [0, taken) have a thread
    for (size_t t = 1; t < threads && taken < n; ++t) {
      try {
        pool.emplace_back(StatRange, std::cref(paths), taken, std::min(n, taken + per),
                          out.data());
      } catch (const std::system_error&) {
        break;  // no more threads: this one does the rest
      }
      taken = std::min(n, taken + per);
    }
    StatRange(paths, 0, std::min(n, per), out.data());
    StatRange(paths, taken, n, out.data());
    for (std::thread& th : pool) th.join();
  }
  return py::bytes(reinterpret_cast<const char*>(out.data()),
                   out.size() * sizeof(int64_t));
}

}  // namespace shmcache::python
