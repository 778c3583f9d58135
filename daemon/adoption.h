// Adoption: a starting server takes over the sessions and caches an earlier
// server on the same port left in the shm dir, and removes what it cannot
// use. Each cache is re-opened by CacheState::Adopt (its header, tables and
// segments, each checked before use); a cache that cannot be trusted, or
// whose header is gone, has its files removed and its spilled rows dropped,
// and spilled rows of caches whose memory state is gone are dropped too.
// Each such loss is noted (NoteFn: the Store logs it and keeps it for
// startup_notes()). Names in the shm dir that no server of this layout
// writes are removed unopened.
//
// Ownership: what it adopts is handed to the caller in Adopted; it keeps
// nothing. Thread safety: Run is called once, by Store::Init under the
// Store's mutex (the caches' memory is reserved in the Store's account),
// before any request runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/cache_state.h"
#include "daemon/memory_account.h"
#include "format/instance.h"

namespace shmcache {

class CacheSpiller;
class Logger;

// What an earlier server left, taken over.
struct Adopted {
  // Session id -> its cache ids; sessions without caches too.
  std::map<uint32_t, std::vector<uint32_t>> sessions;
  std::map<uint32_t, std::unique_ptr<CacheState>> caches;
};

class Adoption {
 public:
  using NoteFn = std::function<void(const std::string&)>;

  // watch_pid: the process the server watches (--watch_pid), 0 for none;
  // only the test hook SHMCACHE_TEST_HOLD_START looks at it. `spiller`
  // drops the spilled rows of what is discarded.
  Adoption(const InstancePaths& paths, int num_nodes, int watch_pid,
           CacheSpiller* spiller, Logger* log, NoteFn note);

  // Adopts into *out, reserving each cache's memory in `account`. False
  // when *stop_requested turned true before it finished: what is adopted so
  // far is in *out, and the files not adopted yet are left as they are.
  bool Run(const std::atomic<bool>* stop_requested, MemoryAccount* account, Adopted* out);

 private:
  void ReadSessionsFile(Adopted* out);
  void DiscardCacheFiles(uint32_t cache_id, const std::vector<std::string>& files,
                         const std::string& why);
  // Drops a cache's rows from the spill store; a failure is logged.
  void DropSpilledRows(uint32_t cache_id);

  InstancePaths paths_;
  int num_nodes_;
  int watch_pid_;
  CacheSpiller* spiller_;
  Logger* log_;
  NoteFn note_;
};

}  // namespace shmcache
