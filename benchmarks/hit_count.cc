// The hit path for callgrind: instructions per Cache::Get or Cache::View
// hit, or per row of a Cache::ViewBatch of 64, one configuration per run
// (docs/hit-path.md).
//
//   shmcache_hit_count get|view|viewbatch|getbatch ROWS BYTES [--port P]
//
// Opens a cache of size 0 (as a trainer opens one) in a new session, puts
// ROWS rows of BYTES bytes, reads every row once with the other call (so
// segments are mapped and the lane taken outside what is counted), then
// makes 100,000 calls of the one named on random ids, and drops the
// session. Count only those calls, e.g. with callgrind's
// --toggle-collect='shmcache::Cache::Get(*' for `get 65536 3072`, and
// divide the collected instructions, less the copy's memcpy, by 100,000.
// `viewbatch` makes 100,000 / 64 calls of ViewBatch of 64 random ids
// (--toggle-collect='shmcache::Cache::ViewBatch(*'): divide by 99,968;
// `getbatch` the same with GetBatch ('shmcache::Cache::GetBatch(*', less
// the copies' memcpy).
// Measures nothing itself; exits non-zero when a call fails.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "shmcache/client.h"

namespace {

using shmcache::Cache;
using shmcache::CacheOptions;
using shmcache::Client;
using shmcache::ClientOptions;
using shmcache::Status;

constexpr int kCalls = 100000;
constexpr size_t kBatch = 64;  // ids per ViewBatch (a data loader's batch)

int Fail(const Status& s) {
  std::fprintf(stderr, "shmcache_hit_count: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && !(argc == 6 && std::strcmp(argv[4], "--port") == 0)) {
    std::fprintf(
        stderr,
        "usage: shmcache_hit_count get|view|viewbatch|getbatch ROWS BYTES [--port P]\n");
    return 2;
  }
  const bool get = std::strcmp(argv[1], "get") == 0;
  const bool get_batch = std::strcmp(argv[1], "getbatch") == 0;
  const bool batch = get_batch || std::strcmp(argv[1], "viewbatch") == 0;
  const uint64_t rows = std::strtoull(argv[2], nullptr, 10);
  const size_t bytes = std::strtoull(argv[3], nullptr, 10);
  if ((!get && !batch && std::strcmp(argv[1], "view") != 0) || rows == 0 || bytes == 0) {
    std::fprintf(
        stderr,
        "usage: shmcache_hit_count get|view|viewbatch|getbatch ROWS BYTES [--port P]\n");
    return 2;
  }
  ClientOptions co;
  if (argc == 6) co.port = std::atoi(argv[5]);
  std::unique_ptr<Client> client;
  Status s = Client::Connect(co, &client);
  if (!s.ok()) return Fail(s);
  uint32_t session = 0;
  s = client->CreateSession(&session);
  if (!s.ok()) return Fail(s);
  CacheOptions o;
  o.session_id = session;
  o.name = "hit-count";
  o.fingerprint = "hit-count";
  std::unique_ptr<Cache> cache;
  s = client->OpenCache(o, &cache);
  const std::vector<char> data(bytes, 7);
  for (uint64_t id = 0; s.ok() && id < rows; ++id) s = cache->Put(id, data.data(), bytes);
  shmcache::RowView view;
  shmcache::Row row;
  for (uint64_t id = 0; s.ok() && id < rows; ++id) {
    s = get ? cache->View(id, &view) : cache->Get(id, &row);
  }
  std::mt19937_64 rng(42);
  std::vector<uint64_t> ids(kCalls);
  for (uint64_t& id : ids) id = rng() % rows;
  uint64_t sum = 0;
  std::vector<shmcache::RowView> views(kBatch);
  std::vector<shmcache::Row> rows_out(kBatch);
  std::vector<Status> sts(kBatch);
  for (size_t i = 0; batch && s.ok() && i + kBatch <= ids.size(); i += kBatch) {
    const auto batch_ids = std::span(ids).subspan(i, kBatch);
    s = get_batch ? cache->GetBatch(batch_ids, rows_out, sts)
                  : cache->ViewBatch(batch_ids, views, sts);
    for (size_t k = 0; s.ok() && k < kBatch; ++k) {
      s = sts[k];
      const shmcache::RowView& got = get_batch ? rows_out[k].view() : views[k];
      if (s.ok()) sum += static_cast<uint64_t>(got.column(0).data[0]);
    }
  }
  for (size_t i = 0; !batch && s.ok() && i < ids.size(); ++i) {
    if (get) {
      s = cache->Get(ids[i], &row);
      if (s.ok()) sum += static_cast<uint64_t>(row.view().encoded()[0]);
    } else {
      s = cache->View(ids[i], &view);
      if (s.ok()) sum += static_cast<uint64_t>(view.column(0).data[0]);
    }
  }
  cache.reset();
  client->DestroySession(session).PermitUncheckedError();
  if (!s.ok()) return Fail(s);
  std::printf(
      "%d %s calls, checksum %llu\n", kCalls,
      get ? "Get" : (get_batch ? "GetBatch row" : (batch ? "ViewBatch row" : "View")),
      static_cast<unsigned long long>(sum));
  return 0;
}
