// shmcache_bench: one run of every C++ measurement, each a rate next to its
// references (the memcpy limit, Redis, LMDB, RocksDB) measured in the same
// run. Prints progress to stderr and writes JSON.
//
//   shmcache_bench [--sections memcpy,put,shmcache,hit,spill,redis,lmdb,rocksdb,
//                              spillcheck,sweep]
//                  [--seconds S] [--working_set_mb M] [--procs 1,2] [--sweep 1,2,4]
//                  [--port P] [--redis_socket PATH] [--lmdb_dir DIR]
//                  [--rocksdb_dir DIR] [--out FILE]
//
// A reference whose option is missing (or whose library was not found at
// build time) is skipped and the JSON says why. Not a test: nothing here
// asserts a timing.
#include <sys/mman.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "benchmarks/sections.h"
#include "common/command_line.h"
#include "format/parse_number.h"

namespace {

using shmcache::Status;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Status Bad(const std::string& option, const std::string& v) {
  return Status::InvalidArgument("bad value for " + option + ": '" + v + "'");
}

// The options into *c, each checked as it is read.
void AddOptions(shmcache::CommandLine& cl, bench::Config* c) {
  cl.AddValue("--sections", [c](const std::string& v) {
    c->sections = Split(v);
    return Status::OK();
  });
  cl.AddValue("--seconds", [c](const std::string& v) {
    bool ok = shmcache::ParseDouble(v, &c->seconds) && c->seconds > 0;
    return ok ? Status::OK() : Bad("--seconds", v);
  });
  cl.AddValue("--working_set_mb", [c](const std::string& v) {
    long mb = 0;
    if (!shmcache::ParseDecimal(v, 8, 1L << 30, &mb)) return Bad("--working_set_mb", v);
    c->working_set = static_cast<size_t>(mb) << 20;
    return Status::OK();
  });
  cl.AddValue("--procs", [c](const std::string& v) {
    c->procs.clear();
    for (const std::string& p : Split(v)) {
      long n = 0;
      if (!shmcache::ParseDecimal(p, 1, 4096, &n)) return Bad("--procs", v);
      c->procs.push_back(static_cast<int>(n));
    }
    return c->procs.empty() ? Bad("--procs", v) : Status::OK();
  });
  cl.AddValue("--sweep", [c](const std::string& v) {
    c->sweep.clear();
    for (const std::string& p : Split(v)) {
      long n = 0;
      if (!shmcache::ParseDecimal(p, 1, 4096, &n)) return Bad("--sweep", v);
      c->sweep.push_back(static_cast<int>(n));
    }
    return c->sweep.empty() ? Bad("--sweep", v) : Status::OK();
  });
  cl.AddValue("--port", [c](const std::string& v) {
    long port = 0;
    if (!shmcache::ParseDecimal(v, 0, 65535, &port)) return Bad("--port", v);
    c->port = static_cast<int>(port);
    return Status::OK();
  });
  auto text = [](std::string* out) {
    return [out](const std::string& v) {
      *out = v;
      return Status::OK();
    };
  };
  cl.AddValue("--redis_socket", text(&c->redis_socket));
  cl.AddValue("--lmdb_dir", text(&c->lmdb_dir));
  cl.AddValue("--rocksdb_dir", text(&c->rocksdb_dir));
  cl.AddValue("--out", text(&c->out));
}

int Usage(const Status& why) {
  std::fprintf(stderr,
               "shmcache_bench: %s\n"
               "usage: shmcache_bench [--sections LIST] [--seconds S] "
               "[--working_set_mb M] [--procs 1,2] [--sweep 1,2,4] [--port P] "
               "[--redis_socket PATH] [--lmdb_dir DIR] [--rocksdb_dir DIR] "
               "[--out FILE]\n",
               why.message().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Config c;
  shmcache::CommandLine cl("shmcache_bench", "see the usage below");
  AddOptions(cl, &c);
  Status s = cl.Parse(std::vector<std::string>(argv, argv + argc));
  if (!s.ok()) return Usage(s);

  // The rows every system stores: random bytes, larger than the LLC.
  void* mem = mmap(nullptr, c.working_set, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  bench::FillRandom(mem, c.working_set, 1);
  bench::Source src{static_cast<const char*>(mem), c.working_set};
  bench::Report report;
  report.Value("config.seconds", c.seconds);
  report.Value("config.working_set_mb", static_cast<double>(c.working_set >> 20));

  using Fn = void (*)(const bench::Config&, const bench::Source&, bench::Report*);
  auto section = [&](const char* name, Fn fn, bool available, const std::string& why) {
    if (!c.Wants(name)) return;
    std::fprintf(stderr, "== %s\n", name);
    double t0 = bench::NowSec();
    if (available) fn(c, src, &report);
    else report.Skip(name, why);
    report.Value(std::string("time.") + name, bench::NowSec() - t0);
  };
  section("memcpy", bench::BenchMemcpy, true, "");
  section("put", bench::BenchPut, true, "");
  section("shmcache", bench::BenchShmcache, true, "");
  section("hit", bench::BenchHit, true, "");
  section("spill", bench::BenchSpill, true, "");
  section("redis", bench::BenchRedis, !c.redis_socket.empty(), "no --redis_socket");
  section("lmdb", bench::BenchLmdb, !c.lmdb_dir.empty(), "no --lmdb_dir");
  section("rocksdb", bench::BenchRocksdb, !c.rocksdb_dir.empty(), "no --rocksdb_dir");
  section("spillcheck", bench::BenchSpillCheck, !c.rocksdb_dir.empty(),
          "no --rocksdb_dir");
  section("sweep", bench::BenchSweep, true, "");
  if (!report.Write(c.out)) {
    std::perror(c.out.c_str());
    return 1;
  }
  return 0;
}
