// What the capacity suites (capacity_test.cc, spill_test.cc,
// spill_stage_test.cc) share: caches opened with a budget and spilling or
// not, rows of kRowBytes put (one by one or in batches) and checked from
// another process, and the memory the rows take.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "shmcache/client.h"
#include "tests/support/test_server.h"

namespace shmcache::test {

constexpr size_t kRowBytes = 3072;
constexpr uint64_t kMB = 1 << 20;

// Sizes of this server's data segment files (the rows' memory).
uint64_t SegmentBytes(const TestServer& server);

// Cache `name` of `session`, with a budget of `size_mb` and spilling or
// not; a failure fails the test (and returns null).
std::unique_ptr<Cache> OpenCache(const TestServer& server, uint32_t session,
                                 uint64_t size_mb, bool spilling,
                                 const std::string& name = "capacity");

// As OpenCache, for a forked child (which uses no gtest): null when the
// cache could not be opened.
std::unique_ptr<Cache> OpenCacheInChild(const TestServer& server, uint32_t session,
                                        uint64_t size_mb, bool spilling,
                                        const std::string& name = "capacity");

// Puts rows 0..n-1 of kRowBytes; returns how many were stored (OK) before
// the first Full. Any other status fails the test.
size_t PutRows(Cache* cache, size_t n, uint64_t salt = 7);

// Checks rows 0..n-1 of cache `name` in a forked child (another process);
// returns the number it found byte-identical, or -1 on a wrong row.
long CheckRowsInChild(const TestServer& server, uint32_t session, size_t n, bool spilling,
                      uint64_t salt = 7, const std::string& name = "capacity");

// PutBatch of rows [first, first + statuses.size()) of kRowBytes pattern
// bytes (as PutRows makes them), each a uint8 column "data"; returns
// PutBatch's status, each row's in statuses (and inserted, when not empty).
Status PutRowBatch(Cache* cache, uint64_t first, std::span<Status> statuses,
                   std::span<bool> inserted = {}, uint64_t salt = 7);

// Puts row `id` of `nbytes` pattern bytes (salt 7, as PutRows).
Status PutBytes(Cache* cache, uint64_t id, size_t nbytes, bool* inserted = nullptr);

}  // namespace shmcache::test
