// Spilled-row batch reads for callgrind: shmcache's GetBatch of 64 random
// spilled ids against RocksDB's MultiGet of 64 on the same rows, one side
// per run (docs/spill-reads.md).
//
//   shmcache_spill_read_count shmcache ROWS BYTES CALLS [--port P]
//   shmcache_spill_read_count rocksdb|rocksdb-cached ROWS BYTES CALLS DIR
//
// shmcache: opens a spilling cache of 1 MB in a new session (a server with
// a spill dir), puts ROWS rows of BYTES bytes, reads every row once, waits
// for the daemon's idle flush to reach this process's reader (it reads
// every row again after 2.5 s, twice: the reader catches up once a second
// while it reads, and the second catch-up lets go of the rows it replayed
// from the log), then makes CALLS calls of Cache::GetBatch of 64 random
// ids among the spilled rows (printing how many data blocks RocksDB read
// for them: rocksdb::PerfContext::block_read_count), and drops the
// session. rocksdb: writes the
// same rows, keyed by their 8-byte id, into a new database in DIR (removed
// first and at the end) with the spill reader's options
// (format/spill_format.h: the spill section's best RocksDB peer at 3 KB),
// or, rocksdb-cached, with BlobDB and a 256 MB block cache
// (bench::TuneBlobDb) (the spillcheck section's best at
// 3 KB, every row then in its block cache), flushes, opens it read-only,
// reads every row once, then makes
// CALLS calls of ReadPeerBatch: MultiGet of 64 random ids, each value
// copied out into a buffer kept between calls, as the harness's peer does
// (benchmarks/rocksdb_peer.cc).
//
// Count only the calls, e.g. with callgrind's
// --toggle-collect='shmcache::Cache::GetBatch(*' or
// --toggle-collect='ReadPeerBatch(*', and divide by CALLS. A shmcache
// reader catches up with the daemon once a second while it reads
// (SpillReader::kRefreshIntervalMs): under callgrind that is more often
// per call than at full speed; its cost is under
// rocksdb::DBImplSecondary::TryCatchUpWithPrimary. Measures nothing
// itself; exits non-zero when a read fails.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/perf_context.h>
#include <rocksdb/perf_level.h>

#include "benchmarks/rocksdb_peer.h"
#include "format/spill_format.h"
#include "shmcache/client.h"

namespace {

using shmcache::Status;

constexpr size_t kBatch = 64;

int Usage() {
  std::fprintf(stderr,
               "usage: shmcache_spill_read_count shmcache ROWS BYTES CALLS [--port P]\n"
               "       shmcache_spill_read_count rocksdb|rocksdb-cached ROWS BYTES CALLS "
               "DIR\n");
  return 2;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "shmcache_spill_read_count: %s\n", what.c_str());
  return 1;
}

// Row id's bytes: distinct per id, so that a row read back is checkable.
std::vector<char> RowOf(uint64_t id, size_t bytes) {
  std::vector<char> row(bytes);
  for (size_t i = 0; i < bytes; ++i) row[i] = static_cast<char>(id * 131 + i);
  return row;
}

// CALLS batches of kBatch random ids in [lo, hi).
std::vector<uint64_t> RandomIds(uint64_t lo, uint64_t hi, int calls) {
  std::mt19937_64 rng(42);
  std::vector<uint64_t> ids(static_cast<size_t>(calls) * kBatch);
  for (uint64_t& id : ids) id = lo + rng() % (hi - lo);
  return ids;
}

int CountShmcache(uint64_t rows, size_t bytes, int calls, int port) {
  shmcache::ClientOptions co;
  if (port) co.port = port;
  std::unique_ptr<shmcache::Client> client;
  Status s = shmcache::Client::Connect(co, &client);
  if (!s.ok()) return Fail(s.ToString());
  uint32_t session = 0;
  s = client->CreateSession(&session);
  if (!s.ok()) return Fail(s.ToString());
  shmcache::CacheOptions o;
  o.session_id = session;
  o.name = "spill-read-count";
  o.fingerprint = "spill-read-count";
  o.spill_requested = true;
  o.size_mb = 1;
  std::unique_ptr<shmcache::Cache> cache;
  s = client->OpenCache(o, &cache);
  for (uint64_t id = 0; s.ok() && id < rows; ++id) {
    const std::vector<char> row = RowOf(id, bytes);
    s = cache->Put(id, row.data(), row.size());
  }
  shmcache::CacheStats st;
  if (s.ok()) s = cache->GetStats(&st);
  if (s.ok() && st.disk_rows == 0) s = Status::NotSupported("no row was spilled");
  std::vector<shmcache::Row> out(kBatch);
  std::vector<Status> sts(kBatch);
  for (int pass = 0; pass < 3 && s.ok(); ++pass) {
    if (pass > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    shmcache::Row row;
    for (uint64_t id = 0; s.ok() && id < rows; ++id) s = cache->Get(id, &row);
  }
  const uint64_t first_spilled = rows - st.disk_rows;
  const std::vector<uint64_t> ids = RandomIds(first_spilled, rows, calls);
  uint64_t sum = 0;
  // The reader reads in this thread: RocksDB's own count of the blocks it
  // read for the calls (one per row at best; the spill tables' ranges may
  // overlap).
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kEnableCount);
  rocksdb::get_perf_context()->Reset();
  for (int c = 0; s.ok() && c < calls; ++c) {
    s = cache->GetBatch(std::span(ids).subspan(static_cast<size_t>(c) * kBatch, kBatch),
                        out, sts);
    for (size_t k = 0; s.ok() && k < kBatch; ++k) {
      s = sts[k];
      if (s.ok()) sum += static_cast<unsigned char>(out[k].view().column(0).data[0]);
    }
  }
  const uint64_t blocks = rocksdb::get_perf_context()->block_read_count;
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable);
  cache.reset();
  client->DestroySession(session).PermitUncheckedError();
  if (!s.ok()) return Fail(s.ToString());
  std::printf(
      "%d GetBatch calls of %zu, %llu spilled rows of %llu, %llu blocks read, "
      "checksum %llu\n",
      calls, kBatch, static_cast<unsigned long long>(st.disk_rows),
      static_cast<unsigned long long>(rows), static_cast<unsigned long long>(blocks),
      static_cast<unsigned long long>(sum));
  return 0;
}

struct PeerBuffers {
  std::vector<rocksdb::Slice> keys{kBatch};
  std::vector<rocksdb::PinnableSlice> values{kBatch};
  std::vector<rocksdb::Status> statuses{kBatch};
  std::vector<std::string> out{kBatch};
};

// One timed call: what MultiGetRate does per batch (rocksdb_peer.cc).
[[gnu::noinline]] bool ReadPeerBatch(rocksdb::DB* db, const uint64_t* ids, size_t bytes,
                                     PeerBuffers* b) {
  for (size_t k = 0; k < kBatch; ++k) {
    b->keys[k] = rocksdb::Slice(reinterpret_cast<const char*>(&ids[k]), sizeof ids[k]);
    b->values[k].Reset();
  }
  db->MultiGet(rocksdb::ReadOptions(), db->DefaultColumnFamily(), kBatch, b->keys.data(),
               b->values.data(), b->statuses.data());
  bool good = true;
  for (size_t k = 0; k < kBatch; ++k) {
    good &= b->statuses[k].ok() && b->values[k].size() == bytes;
    b->out[k].assign(b->values[k].data(), b->values[k].size());
  }
  return good;
}

int CountRocksdb(uint64_t rows, size_t bytes, int calls, const std::string& dir,
                 bool cached) {
  std::filesystem::remove_all(dir);
  rocksdb::Options o = shmcache::SpillReaderOptions();
  if (cached) {
    o = rocksdb::Options();
    bench::TuneBlobDb(&o);
  }
  o.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, dir, &raw);
  std::unique_ptr<rocksdb::DB> db(raw);
  for (uint64_t id = 0; s.ok() && id < rows; ++id) {
    const std::vector<char> row = RowOf(id, bytes);
    s = db->Put(rocksdb::WriteOptions(),
                rocksdb::Slice(reinterpret_cast<const char*>(&id), sizeof id),
                rocksdb::Slice(row.data(), row.size()));
  }
  if (s.ok()) s = db->Flush(rocksdb::FlushOptions());
  db.reset();
  if (s.ok()) s = rocksdb::DB::OpenForReadOnly(o, dir, &raw);
  if (s.ok()) db.reset(raw);
  std::string v;
  for (uint64_t id = 0; s.ok() && id < rows; ++id) {
    s = db->Get(rocksdb::ReadOptions(),
                rocksdb::Slice(reinterpret_cast<const char*>(&id), sizeof id), &v);
  }
  // The same ids as the shmcache run reads, whatever its first spilled row:
  // random rows of the whole range read alike here.
  const std::vector<uint64_t> ids = RandomIds(0, rows, calls);
  PeerBuffers b;
  bool good = s.ok();
  uint64_t sum = 0;
  for (int c = 0; good && c < calls; ++c) {
    good = ReadPeerBatch(db.get(), &ids[static_cast<size_t>(c) * kBatch], bytes, &b);
    sum += static_cast<unsigned char>(b.out[0][0]);
  }
  db.reset();
  std::filesystem::remove_all(dir);
  if (!s.ok()) return Fail(s.ToString());
  if (!good) return Fail("a MultiGet failed");
  std::printf("%d MultiGet calls of %zu, checksum %llu\n", calls, kBatch,
              static_cast<unsigned long long>(sum));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return Usage();
  const std::string side = argv[1];
  const uint64_t rows = std::strtoull(argv[2], nullptr, 10);
  const size_t bytes = std::strtoull(argv[3], nullptr, 10);
  const int calls = std::atoi(argv[4]);
  if (rows == 0 || bytes == 0 || calls <= 0) return Usage();
  if (side == "shmcache" &&
      (argc == 5 || (argc == 7 && std::strcmp(argv[5], "--port") == 0)))
    return CountShmcache(rows, bytes, calls, argc == 7 ? std::atoi(argv[6]) : 0);
  if ((side == "rocksdb" || side == "rocksdb-cached") && argc == 6)
    return CountRocksdb(rows, bytes, calls, argv[5], side == "rocksdb-cached");
  return Usage();
}
