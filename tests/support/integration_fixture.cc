#include "tests/support/integration_fixture.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/support/row_pattern.h"

namespace shmcache::test {

CacheOptions Options(uint32_t session, const std::string& name, uint64_t size_mb) {
  CacheOptions o;
  o.session_id = session;
  o.name = name;
  o.fingerprint = name + "-pipeline";
  o.size_mb = size_mb;
  return o;
}

size_t RowBytes(uint64_t id) { return 64 + (id * 131) % (2 * kRowBytes); }

bool RowMatches(const Row& row, uint64_t id, uint64_t salt, size_t n, bool quiet) {
  if (row.num_columns() != 1) {
    if (!quiet) fprintf(stderr, "row %lu: %zu columns\n", id, row.num_columns());
    return false;
  }
  ColumnView c = row.column(0);
  std::vector<uint8_t> want = Pattern(id, salt, n);
  if (c.nbytes != n || c.name != "data" || std::memcmp(c.data, want.data(), n) != 0) {
    if (!quiet) fprintf(stderr, "row %lu: bytes differ (%zu vs %zu)\n", id, c.nbytes, n);
    return false;
  }
  return true;
}

Status PutPattern(Cache& cache, uint64_t id, uint64_t salt, size_t n, bool* inserted) {
  std::vector<uint8_t> v = Pattern(id, salt, n);
  return cache.Put(id, v.data(), v.size(), inserted);
}

}  // namespace shmcache::test
