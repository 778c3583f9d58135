// LMDB (Debian's liblmdb): random get of the same rows from a database in
// /dev/shm. "copy-out" is what a data loader does per sample: a read
// transaction (reset/renew, LMDB's cheapest form), mdb_get and a copy into
// the reader's buffer. "zero-copy" keeps one read transaction open and
// only looks the row up, LMDB's best case.
#include <lmdb.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "benchmarks/sections.h"

namespace bench {
namespace {

bool Check(int rc, const char* what, std::string* err) {
  if (rc == MDB_SUCCESS) return true;
  *err = std::string(what) + ": " + mdb_strerror(rc);
  return false;
}

MDB_env* OpenEnv(const std::string& dir, size_t map_size, bool readonly,
                 std::string* err) {
  MDB_env* env = nullptr;
  if (!Check(mdb_env_create(&env), "mdb_env_create", err)) return nullptr;
  unsigned flags = MDB_NOSYNC | MDB_NOMETASYNC | MDB_NORDAHEAD;
  if (readonly) flags |= MDB_RDONLY;
  if (!Check(mdb_env_set_mapsize(env, map_size), "mdb_env_set_mapsize", err) ||
      !Check(mdb_env_set_maxreaders(env, 64), "mdb_env_set_maxreaders", err) ||
      !Check(mdb_env_open(env, dir.c_str(), flags, 0600), "mdb_env_open", err)) {
    mdb_env_close(env);
    return nullptr;
  }
  return env;
}

}  // namespace

void BenchLmdb(const Config& c, const Source& src, Report* r) {
  for (size_t size : kRowSizes) {
    const std::string k = std::to_string(size);
    const uint32_t n = static_cast<uint32_t>(c.RowsFor(size));
    const std::string dir = c.lmdb_dir + "/rows-" + k;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const size_t map_size = c.working_set * 2 + (256u << 20);
    std::string err;
    MDB_env* env = OpenEnv(dir, map_size, false, &err);
    MDB_txn* txn = nullptr;
    MDB_dbi dbi = 0;
    bool ok =
        env && Check(mdb_txn_begin(env, nullptr, 0, &txn), "mdb_txn_begin", &err) &&
        Check(mdb_dbi_open(txn, nullptr, MDB_INTEGERKEY, &dbi), "mdb_dbi_open", &err);
    double t0 = NowSec();
    for (uint64_t id = 0; ok && id < n; ++id) {
      MDB_val key{sizeof id, &id};
      MDB_val val{size, const_cast<char*>(src.Row(id, size))};
      ok = Check(mdb_put(txn, dbi, &key, &val, MDB_APPEND), "mdb_put", &err);
    }
    ok = ok && Check(mdb_txn_commit(txn), "mdb_txn_commit", &err);
    if (ok) r->Add("put", "lmdb", "one txn", size, 1, n / (NowSec() - t0));
    if (env) mdb_env_close(env);
    if (!ok) {
      r->Skip("lmdb " + k, err);
      std::filesystem::remove_all(dir);
      continue;
    }
    const std::vector<uint32_t> idx = RandomIndices(1u << 20, n, 42 + size);
    const uint64_t mask = idx.size() - 1;
    for (bool copy : {true, false}) {
      for (int p : c.procs) {
        double rate = RunProcs(p, [&](int child) {
          std::string e;
          MDB_env* ev = OpenEnv(dir, map_size, true, &e);
          MDB_txn* tx = nullptr;
          MDB_dbi db = 0;
          if (!ev || mdb_txn_begin(ev, nullptr, MDB_RDONLY, &tx) != 0 ||
              mdb_dbi_open(tx, nullptr, MDB_INTEGERKEY, &db) != 0) {
            std::fprintf(stderr, "lmdb: %s\n", e.c_str());
            return -1.0;
          }
          std::vector<char> dst(size);
          const uint64_t off = static_cast<uint64_t>(child) * 7919;
          bool good = true;
          double rr = TimedRate(c.seconds, [&](uint64_t i) {
            uint64_t id = idx[(i + off) & mask];
            MDB_val key{sizeof id, &id};
            MDB_val val;
            if (copy) {
              mdb_txn_reset(tx);
              good &= mdb_txn_renew(tx) == 0;
            }
            good &= mdb_get(tx, db, &key, &val) == 0 && val.mv_size == size;
            if (copy) std::memcpy(dst.data(), val.mv_data, size);
            DoNotOptimize(val.mv_data);
          });
          mdb_txn_abort(tx);
          mdb_env_close(ev);
          return good ? rr : -1.0;
        });
        const char* v = copy ? "copy-out" : "zero-copy";
        if (rate < 0) r->Skip(std::string("lmdb get ") + v + " " + k, "mdb_get failed");
        else r->Add(copy ? "get" : "view", "lmdb", v, size, p, rate);
      }
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace bench
