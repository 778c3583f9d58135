#include "clients/python/shmcache/shared_byte.h"

#include <atomic>
#include <string>

namespace shmcache::python {

bool ClaimByte(const py::buffer& mapping, py::ssize_t offset) {
  const py::buffer_info info = mapping.request(/*writable=*/true);
  const py::ssize_t bytes = info.size * info.itemsize;
  if (offset < 0 || offset >= bytes) {
    throw py::index_error("claim_byte: offset " + std::to_string(offset) +
                          " is outside the buffer's " + std::to_string(bytes) + " bytes");
  }
  unsigned char& byte = static_cast<unsigned char*>(info.ptr)[offset];
  unsigned char unset = 0;
  return std::atomic_ref<unsigned char>(byte).compare_exchange_strong(unset, 1);
}

}  // namespace shmcache::python
