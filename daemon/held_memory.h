// HeldMemory: shared memory of destroyed sessions that processes still map.
//
// Destroy unlinks a cache's files, but tmpfs frees a file's pages only when
// its last mapping goes: a reader that keeps views open holds them. Until
// then their bytes stay reserved in the MemoryAccount, so the cap counts
// what is really in use and --server_info shows it. The Store looks for the
// mappings (FindMappedDeleted, without its lock) and settles: a file that
// no process maps any more is released.
//
// Thread safety: none; the Store's mutex guards it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/mapped_files.h"
#include "daemon/memory_account.h"

namespace shmcache {

class Logger;

struct HeldFile {
  FileId id;
  uint64_t bytes = 0;
};

// Unlinks `path` (a shared-memory file of `bytes`); with `held`, records
// its identity and size there first, so that the bytes stay reserved while
// processes map it. Returns the bytes recorded.
uint64_t UnlinkHeldFile(const std::string& path, uint64_t bytes,
                        std::vector<HeldFile>* held);

class HeldMemory {
 public:
  using Clock = std::chrono::steady_clock;
  // Scans start this often after a destroy and slow down, doubling, to
  // kMaxScanInterval while readers keep files mapped.
  static constexpr std::chrono::milliseconds kFirstScanInterval{100};
  static constexpr std::chrono::milliseconds kMaxScanInterval{2000};

  // The files of destroyed session `session`. REQUIRES: their bytes are
  // reserved in the account that Settle will release them from.
  void Add(uint32_t session, const std::vector<HeldFile>& files, Clock::time_point now);
  bool empty() const { return files_.empty(); }
  uint64_t bytes() const { return bytes_; }
  // The files a scan looks for, and the processes to look at first (those
  // the last scan found holding some).
  std::vector<FileId> Wanted() const;
  const std::vector<int>& holders() const { return holders_; }
  bool ScanDue(Clock::time_point now) const { return !empty() && now >= next_scan_; }
  // A scan for `looked_for` found `scan`: every file of `looked_for` it
  // did not find mapped is released from `account` (files added since the
  // scan began wait for the next). Logs, once per session, when readers
  // first hold some of it, and how much and for how long once it is all
  // free. Returns the bytes released.
  uint64_t Settle(const std::vector<FileId>& looked_for, const MappedScan& scan,
                  Clock::time_point now, MemoryAccount* account, Logger* log);

 private:
  struct Entry {
    uint32_t session;
    HeldFile file;
    bool seen_mapped = false;
  };
  struct Session {
    Clock::time_point destroyed;
    uint64_t seen_bytes = 0;  // of files a scan found mapped
    size_t files = 0;         // still held
  };
  void NoteMapped(Entry* e, Logger* log);
  void NoteReleased(const Entry& e, Clock::time_point now, Logger* log);

  std::vector<Entry> files_;
  std::map<uint32_t, Session> sessions_;
  uint64_t bytes_ = 0;
  std::vector<int> holders_;
  Clock::time_point next_scan_{};
  Clock::duration interval_ = kFirstScanInterval;
};

}  // namespace shmcache
