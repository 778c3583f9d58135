// Ways the daemon could write a batch of spilled rows into RocksDB, timed
// against each other in one process, interleaved (issue 36: spilling
// PutBatch against the WAL-off peer): the daemon's write batches through
// the write-ahead log, with the log's options tried and with its CRC32C
// by the CPU (daemon/rocksdb_crc32c.h; every other design runs RocksDB's
// own); the log off with each row copied into a kept area (the design
// docs/spill-reads.md measures against the log); batches written as a
// table file (SstFileWriter) and ingested (IngestExternalFile); and the
// peer's one Put per row. Not part of shmcache_bench: a prototype's
// measurement, run by hand; docs/spill-reads.md ("Large batches as table
// files, tried") has its figures and why the daemon does not ingest.
//
//   spill_put_designs DIR [rounds] [MB per size] [name filter] [shuffled]
//
// Every design writes the same rows (12-byte spill keys of one cache,
// ascending row ids, as a fill writes them) into a new database in DIR with
// the spill database's options and the daemon's memtables (4 x 16 MB).
// Printed per design and size: rows/s until the last write returned, and
// the process's CPU seconds per row until then and after a final flush
// (which the WAL designs owe and ingestion does not).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include "benchmarks/bench_util.h"
#include "daemon/rocksdb_crc32c.h"
#include "format/spill_format.h"

namespace {

double CpuSec() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// A file system whose syncs do nothing: what a spill database needs from
// them is nothing (a SIGKILL keeps the page cache; a power loss empties
// /dev/shm, and with it the index that the spilled rows belong to).
class NoSyncFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  using FSWritableFileOwnerWrapper::FSWritableFileOwnerWrapper;
  rocksdb::IOStatus Sync(const rocksdb::IOOptions&, rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::OK();
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions&, rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::OK();
  }
  rocksdb::IOStatus RangeSync(uint64_t, uint64_t, const rocksdb::IOOptions&,
                              rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::OK();
  }
};
class NoSyncFs : public rocksdb::FileSystemWrapper {
 public:
  NoSyncFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "NoSyncFs"; }
  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* d) override {
    std::unique_ptr<rocksdb::FSWritableFile> inner;
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, &inner, d);
    if (s.ok()) r->reset(new NoSyncFile(std::move(inner)));
    return s;
  }
};

struct Rows {
  size_t size;
  std::vector<char> pool;  // 64 distinct rows
  const char* Row(uint64_t id) const { return pool.data() + (id % 64) * size; }
};

struct Design {
  std::string name;
  std::function<void(rocksdb::Options*)> tune;
  // Writes rows [first, first + n) of `rows`; n rows per call.
  std::function<rocksdb::Status(rocksdb::DB*, const Rows&, uint64_t first, uint64_t n,
                                const std::string& dir, const rocksdb::Options&)>
      write;
  uint64_t per_call;        // rows per call at most
  uint64_t bytes_per_call;  // and bytes (at least one row)
};

// Row ids in the order they are written: ascending, or shuffled as a
// DataLoader with shuffle=True fills a cache.
std::vector<uint64_t> g_order;

rocksdb::Status PutEach(rocksdb::DB* db, const Rows& r, uint64_t first, uint64_t n,
                        bool wal) {
  rocksdb::WriteOptions wo;
  wo.disableWAL = !wal;
  rocksdb::Status s;
  for (uint64_t id = first; id < first + n && s.ok(); ++id) {
    shmcache::SpillKey k(1, g_order[id]);
    s = db->Put(wo, k.slice(), rocksdb::Slice(r.Row(g_order[id]), r.size));
  }
  return s;
}

rocksdb::Status Batch(rocksdb::DB* db, const Rows& r, uint64_t first, uint64_t n,
                      bool wal, bool flush_wal) {
  rocksdb::WriteBatch b;
  for (uint64_t id = first; id < first + n; ++id) {
    shmcache::SpillKey k(1, g_order[id]);
    b.Put(k.slice(), rocksdb::Slice(r.Row(g_order[id]), r.size));
  }
  rocksdb::WriteOptions wo;
  wo.disableWAL = !wal;
  rocksdb::Status s = db->Write(wo, &b);
  if (s.ok() && flush_wal) s = db->FlushWAL(false);
  return s;
}

// The kept-copy design's cost (docs/spill-reads.md, "Keeping rows
// instead of the log"): the log off, and each row copied once more into a
// daemon-owned shared-memory area (here a pre-faulted 64 MB ring) that
// readers and a restarted daemon would read until a flush covers it.
std::vector<char> g_kept(64u << 20, 1);
size_t g_kept_at = 0;

rocksdb::Status BatchKept(rocksdb::DB* db, const Rows& r, uint64_t first, uint64_t n) {
  rocksdb::WriteBatch b;
  for (uint64_t id = first; id < first + n; ++id) {
    shmcache::SpillKey k(1, g_order[id]);
    if (g_kept_at + r.size > g_kept.size()) g_kept_at = 0;
    std::memcpy(g_kept.data() + g_kept_at, r.Row(g_order[id]), r.size);
    g_kept_at += r.size;
    b.Put(k.slice(), rocksdb::Slice(r.Row(g_order[id]), r.size));
  }
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  return db->Write(wo, &b);
}

rocksdb::Status IngestFile(rocksdb::DB* db, const Rows& r, uint64_t first, uint64_t n,
                           const std::string& dir, const rocksdb::Options& o,
                           bool keep_cache) {
  const std::string file = dir + ".stage/" + std::to_string(first) + ".sst";
  // invalidate_page_cache (RocksDB's default) drops the file's pages from
  // the page cache every 1 MB written, which readers then read from disk.
  rocksdb::SstFileWriter w(rocksdb::EnvOptions(), o, nullptr, !keep_cache);
  rocksdb::Status s = w.Open(file);
  std::vector<uint64_t> ids(g_order.begin() + static_cast<ptrdiff_t>(first),
                            g_order.begin() + static_cast<ptrdiff_t>(first + n));
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    if (!s.ok()) break;
    shmcache::SpillKey k(1, id);
    s = w.Put(k.slice(), rocksdb::Slice(r.Row(id), r.size));
  }
  if (s.ok()) s = w.Finish();
  if (!s.ok()) return s;
  rocksdb::IngestExternalFileOptions io;
  io.move_files = true;
  io.write_global_seqno = false;
  return db->IngestExternalFile({file}, io);
}

rocksdb::Status Ingest(rocksdb::DB* db, const Rows& r, uint64_t first, uint64_t n,
                       const std::string& dir, const rocksdb::Options& o) {
  return IngestFile(db, r, first, n, dir, o, false);
}

rocksdb::Status IngestKept(rocksdb::DB* db, const Rows& r, uint64_t first, uint64_t n,
                           const std::string& dir, const rocksdb::Options& o) {
  return IngestFile(db, r, first, n, dir, o, true);
}

void Xxh3(rocksdb::Options* o) {
  rocksdb::BlockBasedTableOptions t;
  t.checksum = rocksdb::kXXH3;
  o->table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
}

// The write-ahead log's directory of the design that keeps it in shared
// memory (tmpfs); removed by Run after each use.
std::string g_shm_wal;

std::shared_ptr<rocksdb::FileSystem> g_nosync_fs = std::make_shared<NoSyncFs>();
std::unique_ptr<rocksdb::Env> g_nosync_env = rocksdb::NewCompositeEnv(g_nosync_fs);

std::vector<Design> Designs() {
  constexpr uint64_t kAny = UINT64_MAX;
  std::vector<Design> d;
  auto none = [](rocksdb::Options*) {};
  auto put_each = [](bool wal) {
    return
        [wal](rocksdb::DB* db, const Rows& r, uint64_t f, uint64_t n, const std::string&,
              const rocksdb::Options&) { return PutEach(db, r, f, n, wal); };
  };
  auto batch = [](bool wal, bool flush) {
    return [wal, flush](rocksdb::DB* db, const Rows& r, uint64_t f, uint64_t n,
                        const std::string&, const rocksdb::Options&) {
      return Batch(db, r, f, n, wal, flush);
    };
  };
  d.push_back({"peer: Put each, WAL off", none, put_each(false), 64, kAny});
  d.push_back({"peer: Put each, WAL on", none, put_each(true), 64, kAny});
  // The daemon's requests carry at most 1 MB of rows (a larger row alone).
  d.push_back({"daemon now: WriteBatch <= 64 rows, <= 1 MB, WAL on", none,
               batch(true, false), 64, 1u << 20});
  d.push_back({"daemon now, CRC32C by the CPU",
               [](rocksdb::Options*) { shmcache::SetRocksdbCrc32cByCpu(true); },
               batch(true, false), 64, 1u << 20});
  d.push_back(
      {"WriteBatch <= 1 MB, WAL off, rows copied to a kept area", none,
       [](rocksdb::DB* db, const Rows& r, uint64_t f, uint64_t n, const std::string&,
          const rocksdb::Options&) { return BatchKept(db, r, f, n); },
       64, 1u << 20});
  d.push_back({"WriteBatch 64 rows, WAL on", none, batch(true, false), 64, kAny});
  d.push_back({"WriteBatch <= 1 MB, WAL off (not readable)", none, batch(false, false),
               64, 1u << 20});
  d.push_back({"WriteBatch <= 1 MB, WAL on, manual_wal_flush + FlushWAL",
               [](rocksdb::Options* o) { o->manual_wal_flush = true; }, batch(true, true),
               64, 1u << 20});
  d.push_back({"WriteBatch <= 1 MB, WAL on, 64 MB x 4 memtables",
               [](rocksdb::Options* o) { o->write_buffer_size = 64u << 20; },
               batch(true, false), 64, 1u << 20});
  d.push_back({"WriteBatch <= 1 MB, WAL on, WAL in /dev/shm",
               [](rocksdb::Options* o) { o->wal_dir = g_shm_wal; }, batch(true, false),
               64, 1u << 20});
  d.push_back({"WriteBatch <= 1 MB, WAL on, no fallocate",
               [](rocksdb::Options* o) { o->allow_fallocate = false; },
               batch(true, false), 64, 1u << 20});
  d.push_back({"WriteBatch <= 1 MB, WAL on, unordered_write",
               [](rocksdb::Options* o) { o->unordered_write = true; }, batch(true, false),
               64, 1u << 20});
  d.push_back({"WriteBatch <= 1 MB, WAL on, BlobDB >= 4 KB (no secondaries)",
               [](rocksdb::Options* o) {
                 o->enable_blob_files = true;
                 o->min_blob_size = 4096;
               },
               batch(true, false), 64, 1u << 20});
  d.push_back({"ingest <= 1 MB", none, Ingest, 64, 1u << 20});
  d.push_back({"ingest 64 rows", none, Ingest, 64, kAny});
  d.push_back({"ingest 64 rows, xxh3, no syncs",
               [](rocksdb::Options* o) {
                 Xxh3(o);
                 o->env = g_nosync_env.get();
               },
               Ingest, 64, kAny});
  d.push_back({"ingest <= 8 MB", none, Ingest, kAny, 8u << 20});
  d.push_back({"ingest <= 64 MB", none, Ingest, kAny, 64u << 20});
  d.push_back({"kept: ingest <= 1 MB", none, IngestKept, kAny, 1u << 20});
  d.push_back({"kept: ingest <= 4 MB", none, IngestKept, kAny, 4u << 20});
  d.push_back({"kept: ingest <= 8 MB", none, IngestKept, kAny, 8u << 20});
  d.push_back({"kept: ingest 64 rows", none, IngestKept, 64, kAny});
  d.push_back({"kept: ingest <= 8 MB, no syncs",
               [](rocksdb::Options* o) { o->env = g_nosync_env.get(); }, IngestKept, kAny,
               8u << 20});
  return d;
}

struct Figure {
  double rate, cpu_ack, cpu_flushed;
};

Figure Run(const Design& d, const Rows& rows, uint64_t n, const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir + ".stage");
  std::filesystem::create_directories(dir + ".stage");
  rocksdb::Options o = shmcache::SpillDbOptions();
  o.create_if_missing = true;
  o.IncreaseParallelism(2);
  o.write_buffer_size = 16u << 20;
  o.max_write_buffer_number = 4;
  // RocksDB's own CRC32C (its tables in Debian's build) unless the design
  // asks for the CPU's (daemon/rocksdb_crc32c.h).
  shmcache::SetRocksdbCrc32cByCpu(false);
  d.tune(&o);
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, dir, &raw);
  std::unique_ptr<rocksdb::DB> db(raw);
  Figure f{-1, -1, -1};
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", d.name.c_str(), s.ToString().c_str());
    return f;
  }
  double c0 = CpuSec(), t0 = bench::NowSec();
  const uint64_t per =
      std::max<uint64_t>(1, std::min(d.per_call, d.bytes_per_call / rows.size));
  for (uint64_t first = 0; first < n && s.ok(); first += per) {
    s = d.write(db.get(), rows, first, std::min(per, n - first), dir, o);
  }
  double t1 = bench::NowSec(), c1 = CpuSec();
  if (s.ok()) s = db->Flush(rocksdb::FlushOptions());
  double c2 = CpuSec();
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", d.name.c_str(), s.ToString().c_str());
    return f;
  }
  // Every row there, newest value.
  std::string v;
  for (uint64_t id : {uint64_t{0}, n / 2, n - 1}) {
    shmcache::SpillKey k(1, g_order[id]);
    if (!db->Get(rocksdb::ReadOptions(), k.slice(), &v).ok() ||
        v != std::string(rows.Row(g_order[id]), rows.size)) {
      std::fprintf(stderr, "%s: row %lu wrong\n", d.name.c_str(),
                   static_cast<unsigned long>(id));
      return f;
    }
  }
  f = {static_cast<double>(n) / (t1 - t0), (c1 - c0) / static_cast<double>(n),
       (c2 - c0) / static_cast<double>(n)};
  db.reset();
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir + ".stage");
  std::filesystem::remove_all(g_shm_wal);
  return f;
}

// Whether `name` holds one of the '|'-separated parts of `filter` (all
// names match an empty filter).
bool Matches(const std::string& name, const std::string& filter) {
  if (filter.empty()) return true;
  size_t from = 0;
  while (true) {
    size_t bar = filter.find('|', from);
    std::string part = filter.substr(from, bar == std::string::npos ? bar : bar - from);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    if (bar == std::string::npos) return false;
    from = bar + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [rounds] [MB per size] [filter]\n", argv[0]);
    return 2;
  }
  const std::string dir = std::string(argv[1]) + "/db";
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2;
  const uint64_t mb = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 128;
  const std::string filter = argc > 4 ? argv[4] : "";
  const bool shuffled = argc > 5 && std::string(argv[5]) == "shuffled";
  g_shm_wal = "/dev/shm/spill_put_designs." + std::to_string(getpid()) + ".wal";
  std::vector<Design> designs = Designs();
  std::mt19937_64 rng(7);
  std::map<std::pair<size_t, std::string>, std::vector<Figure>> figs;
  for (size_t size : {size_t{3} << 10, size_t{150} << 10, size_t{1} << 20}) {
    Rows rows{size, std::vector<char>(64 * size)};
    for (char& c : rows.pool) c = static_cast<char>(rng());
    const uint64_t n = std::max<uint64_t>(512, (mb << 20) / size) / 512 * 512;
    g_order.resize(n);
    for (uint64_t i = 0; i < n; ++i) g_order[i] = i;
    if (shuffled) std::shuffle(g_order.begin(), g_order.end(), rng);
    for (int r = 0; r < rounds; ++r) {
      for (const Design& d : designs) {
        if (!Matches(d.name, filter)) continue;
        Figure f = Run(d, rows, n, dir);
        figs[{size, d.name}].push_back(f);
        std::printf("%4zu KB  round %d  %-62s %9.0f rows/s  cpu %6.1f / %6.1f us/row\n",
                    size >> 10, r, d.name.c_str(), f.rate, f.cpu_ack * 1e6,
                    f.cpu_flushed * 1e6);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\nmedians (rows/s; us CPU per row to ack / with the final flush)\n");
  for (const auto& entry : figs) {
    const auto& key = entry.first;
    const std::vector<Figure>& v = entry.second;
    // Each figure's median over the rounds (of two, the mean).
    auto med = [&](auto get) {
      std::vector<double> x;
      x.reserve(v.size());
      for (const Figure& f : v) x.push_back(get(f));
      std::sort(x.begin(), x.end());
      const size_t m = x.size() / 2;
      return x.size() % 2 == 1 ? x[m] : (x[m - 1] + x[m]) / 2;
    };
    std::printf("%4zu KB  %-62s %9.0f  %6.1f / %6.1f\n", key.first >> 10,
                key.second.c_str(), med([](const Figure& f) { return f.rate; }),
                med([](const Figure& f) { return f.cpu_ack; }) * 1e6,
                med([](const Figure& f) { return f.cpu_flushed; }) * 1e6);
  }
  return 0;
}
