// How long the index growth stalls other processes (issue 36 item 5,
// docs/hit-path.md "One index table at 1 Mi rows"): the daemon copies the
// index into each new table under its store lock, so every request that
// takes that lock (a lease: a put whose chunk ran out; a growth; an open)
// waits for the copy. Gets read the shared memory and take no lock.
//
// One process fills a fresh size-0 cache with `rows` 8-byte rows
// (PutBatch of 64): the index grows at 3/4 of each table, 2^18 slots
// doubled. Three forked probers, each with its own connection, loop on
// one call: a View of a row put before they started (lock-free),
// CheckSession (the store lock, as a lease takes it), a PutBatch of 8 rows
// of its own into the same cache (a second writer, which meets each full
// table too). It prints, for the filler's slowest PutBatch calls (the
// growths among them), that call's wall time and the probers' longest
// call of each kind that overlapped it. Wall times: the machine is shared, so each figure
// is an upper bound on the growth's share (run it several times).
//
//   grow_stall PORT ROWS
//
// Run by hand, against a server started with its own run dir. Measures;
// asserts nothing but that every row was stored.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "benchmarks/by_hand.h"
#include "shmcache/client.h"

namespace {

using shmcache::Status;
using shmcache::by_hand::Fail;
using shmcache::by_hand::Now;

// One call that took long: when it began, how long, and (a put) its first
// row.
struct Slow {
  double at;
  double ms;
  uint64_t row;
};

// Shared between the filler and the prober (an anonymous shared mapping).
struct Shared {
  std::atomic<int> ready;
  std::atomic<int> stop;
  std::atomic<uint64_t> calls;
  Slow lock[64];  // the slowest CheckSession calls, longest first
  Slow get[64];
  Slow put[64];
};

void Keep(Slow* top, double at, double ms, uint64_t row = 0) {
  if (ms <= top[63].ms) return;
  top[63] = {at, ms, row};
  std::sort(top, top + 64, [](const Slow& a, const Slow& b) { return a.ms > b.ms; });
}

// PutBatch of n 8-byte rows, ids first.., each row's status checked.
Status Put(shmcache::Cache* cache, uint64_t first, size_t n) {
  constexpr size_t kRow = 8, kMax = 64;
  static const unsigned char data[kRow] = {7, 7, 7, 7, 7, 7, 7, 7};
  static const int64_t shape[1] = {static_cast<int64_t>(kRow)};
  shmcache::ColumnRef cols[kMax];
  std::span<const shmcache::ColumnRef> refs[kMax];
  uint64_t ids[kMax];
  Status statuses[kMax];
  for (size_t i = 0; i < n; ++i) {
    cols[i] = {.name = "data", .shape = shape, .data = data, .nbytes = kRow};
    refs[i] = std::span(&cols[i], 1);
    ids[i] = first + i;
  }
  Status r =
      cache->PutBatch(std::span(ids, n), std::span(refs, n), std::span(statuses, n));
  for (size_t i = 0; i < n && r.ok(); ++i) r = statuses[i];
  return r;
}

// What a prober does in its loop.
enum class Kind { kView, kCheckSession, kPut };

int Probe(Kind kind, int port, uint32_t session, Shared* shared) {
  std::unique_ptr<shmcache::Client> client;
  Status s = shmcache::Client::Connect({.port = port}, &client);
  if (!s.ok()) return Fail("prober connect", s);
  std::unique_ptr<shmcache::Cache> cache;
  s = client->OpenCache(
      {.session_id = session, .fingerprint = "grow-stall", .size_mb = 0}, &cache);
  if (!s.ok()) return Fail("prober open", s);
  shared->ready.fetch_add(1);
  uint64_t id = 0;
  uint64_t next_put = (1ULL << 40) * (1 + static_cast<uint64_t>(kind));  // its own ids
  while (shared->stop.load() == 0) {
    const double t0 = Now();
    Slow* top = shared->get;
    switch (kind) {
      case Kind::kView: {
        shmcache::RowView view;
        (void)cache->View(id++ % 1024, &view).ok();
        break;
      }
      case Kind::kCheckSession:
        s = client->CheckSession(session);
        top = shared->lock;
        break;
      case Kind::kPut:
        s = Put(cache.get(), next_put, 8);
        next_put += 8;
        top = shared->put;
        break;
    }
    if (!s.ok()) return Fail("prober", s);
    Keep(top, t0, (Now() - t0) * 1e3);
    shared->calls.fetch_add(1);
    usleep(200);  // a probe, not a load: the filler keeps the CPUs
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: grow_stall PORT ROWS\n");
    return 2;
  }
  const int port = std::atoi(argv[1]);
  const uint64_t rows = std::strtoull(argv[2], nullptr, 10);
  constexpr size_t kBatch = 64;
  std::unique_ptr<shmcache::Client> client;
  std::unique_ptr<shmcache::Cache> cache;
  uint32_t session = 0;
  Status s;
  if (const char* step = shmcache::by_hand::OpenInNewSession(
          port, {.fingerprint = "grow-stall", .size_mb = 0}, &client, &session, &cache,
          &s)) {
    return Fail(step, s);
  }
  auto* shared =
      static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) return 1;
  auto put = [&](uint64_t first) {
    return Put(cache.get(), first, std::min<uint64_t>(kBatch, rows - first));
  };
  // The rows the prober gets, before it starts.
  for (uint64_t first = 0; first < 1024; first += kBatch) {
    s = put(first);
    if (!s.ok()) return Fail("put", s);
  }
  pid_t children[3];
  const Kind kinds[3] = {Kind::kView, Kind::kCheckSession, Kind::kPut};
  for (int k = 0; k < 3; ++k) {
    children[k] = fork();
    if (children[k] == 0) _exit(Probe(kinds[k], port, session, shared));
  }
  while (shared->ready.load() < 3) usleep(1000);
  Slow puts[64] = {};
  const double t0 = Now();
  for (uint64_t first = 1024; first < rows; first += kBatch) {
    const double a = Now();
    s = put(first);
    Keep(puts, a, (Now() - a) * 1e3, first);
    if (!s.ok()) break;
  }
  const double t1 = Now();
  shared->stop.store(1);
  bool children_ok = true;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    children_ok = children_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!s.ok()) return Fail("put", s);
  std::printf("rows=%llu fill_s=%.2f probe_calls=%llu\n",
              static_cast<unsigned long long>(rows), t1 - t0,
              static_cast<unsigned long long>(shared->calls.load()));
  // The slowest puts, in time order, with the prober's slowest calls that
  // began during each (its CheckSession waited for the lock then).
  std::sort(puts, puts + 64, [](const Slow& a, const Slow& b) { return a.ms > b.ms; });
  std::sort(puts, puts + 8, [](const Slow& a, const Slow& b) { return a.at < b.at; });
  for (int i = 0; i < 8; ++i) {
    // The prober's longest call of each kind that overlapped this put.
    auto during = [&](const Slow* top) {
      double ms = 0;
      for (int j = 0; j < 64; ++j) {
        const Slow& c = top[j];
        if (c.ms > 0 && c.at <= puts[i].at + puts[i].ms / 1e3 &&
            c.at + c.ms / 1e3 >= puts[i].at) {
          ms = std::max(ms, c.ms);
        }
      }
      return ms;
    };
    const double lock_ms = during(shared->lock), put_ms = during(shared->put),
                 get_ms = during(shared->get);
    std::printf(
        "put of rows from %llu at %.3f s: %.1f ms; prober during it: CheckSession %.1f "
        "ms, PutBatch of 8 %.1f ms, View %.3f ms\n",
        static_cast<unsigned long long>(puts[i].row), puts[i].at - t0, puts[i].ms,
        lock_ms, put_ms, get_ms);
  }
  std::printf(
      "prober slowest: CheckSession %.1f ms, PutBatch of 8 %.1f ms, View %.3f ms\n",
      shared->lock[0].ms, shared->put[0].ms, shared->get[0].ms);
  cache.reset();
  return client->DestroySession(session).ok() && children_ok ? 0 : 1;
}
