// shmcache_bench: one run of every C++ measurement, each a rate next to its
// references (the memcpy limit, Redis, LMDB, RocksDB) measured in the same
// run. Prints progress to stderr and writes JSON.
//
//   shmcache_bench [--sections memcpy,put,shmcache,spill,redis,lmdb,rocksdb]
//                  [--seconds S] [--working_set_mb M] [--procs 1,2]
//                  [--port P] [--redis_socket PATH] [--lmdb_dir DIR]
//                  [--rocksdb_dir DIR] [--out FILE]
//
// A reference whose option is missing (or whose library was not found at
// build time) is skipped and the JSON says why. Not a test: nothing here
// asserts a timing.
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "sections.h"

namespace {

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int Usage() {
  std::fprintf(stderr,
               "usage: shmcache_bench [--sections LIST] [--seconds S] "
               "[--working_set_mb M] [--procs 1,2] [--port P] "
               "[--redis_socket PATH] [--lmdb_dir DIR] [--rocksdb_dir DIR] "
               "[--out FILE]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return Usage();
    std::string v = argv[++i];
    if (a == "--sections") c.sections = Split(v);
    else if (a == "--seconds") c.seconds = std::atof(v.c_str());
    else if (a == "--working_set_mb") c.working_set = std::strtoull(v.c_str(), nullptr, 10) << 20;
    else if (a == "--procs") {
      c.procs.clear();
      for (const auto& p : Split(v)) c.procs.push_back(std::atoi(p.c_str()));
    } else if (a == "--port") c.port = std::atoi(v.c_str());
    else if (a == "--redis_socket") c.redis_socket = v;
    else if (a == "--lmdb_dir") c.lmdb_dir = v;
    else if (a == "--rocksdb_dir") c.rocksdb_dir = v;
    else if (a == "--out") c.out = v;
    else return Usage();
  }
  if (c.seconds <= 0 || c.working_set < (8u << 20) || c.procs.empty()) return Usage();

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
  auto section = [&](const char* name, Fn fn, bool available,
                     const std::string& why) {
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
  section("spill", bench::BenchSpill, true, "");
  section("redis", bench::BenchRedis, !c.redis_socket.empty(), "no --redis_socket");
  section("lmdb", bench::BenchLmdb, !c.lmdb_dir.empty(), "no --lmdb_dir");
  section("rocksdb", bench::BenchRocksdb, !c.rocksdb_dir.empty(), "no --rocksdb_dir");
  if (!report.Write(c.out)) {
    std::perror(c.out.c_str());
    return 1;
  }
  return 0;
}
