// MemoryAccount: the server-wide cap on shared memory. Every segment and
// index table is reserved here before it is created, so the sum of all
// caches never passes the cap.
// Thread safety: none; the Store's mutex guards it.
#pragma once

#include <cstdint>

namespace shmcache {

struct MemoryAccount {
  uint64_t cap = 0;
  uint64_t used = 0;

  bool Reserve(uint64_t n) {
    if (n > cap - used) return false;
    used += n;
    return true;
  }
  void Release(uint64_t n) { used = n > used ? 0 : used - n; }
  uint64_t available() const { return cap - used; }
};

}  // namespace shmcache
