// Shared by the fuzz targets: a daemon-side Store over a private shm dir,
// created once per fuzzing process and emptied after every input.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "daemon/daemon_options.h"
#include "daemon/logger.h"
#include "daemon/store.h"
#include "format/instance.h"

namespace shmcache::fuzz {

// A private directory under `parent`, removed at exit. Under
// $SHMCACHE_FUZZ_TMPDIR when set: run_fuzz.sh points it at a directory of
// its own and removes that afterwards, so a crashed input (no exit
// handlers) leaves nothing behind.
inline std::string MakeTempDir(const char* parent) {
  if (const char* own = std::getenv("SHMCACHE_FUZZ_TMPDIR"); own != nullptr && *own) {
    parent = own;
  }
  std::string t = std::string(parent) + "/shmcache-fuzz.XXXXXX";
  if (mkdtemp(t.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  return t;
}

struct FuzzEnv {
  std::string shm_dir = MakeTempDir("/dev/shm");
  std::string run_dir = MakeTempDir("/tmp");
  DaemonOptions options;
  InstancePaths paths;
  Logger log;

  FuzzEnv() {
    options.memory_cap_bytes = 64u << 20;  // bounds what one input may create
    options.run_dir = run_dir;
    options.shm_dir = shm_dir;
    paths = MakeInstancePaths(50999, run_dir, shm_dir);
    log.Open(run_dir + "/log", 4).PermitUncheckedError();  // fatal only
  }
  ~FuzzEnv() {
    std::string cmd = "rm -rf '" + shm_dir + "' '" + run_dir + "'";
    if (std::system(cmd.c_str()) != 0) std::perror("cleanup");
  }
  std::unique_ptr<Store> NewStore() {
    return std::make_unique<Store>(options, paths, 1, 1, &log);
  }
};

inline FuzzEnv& Env() {
  static FuzzEnv* env = [] {
    auto* e = new FuzzEnv();
    std::atexit([] { delete &Env(); });
    return e;
  }();
  return *env;
}

}  // namespace shmcache::fuzz
