// Instance: how a port number names one shmcached instance, and the paths
// derived from it. No TCP port is ever opened: the port only names the
// control socket and the shared-memory files.
//
//   run dir     $SHMCACHE_RUN_DIR or /tmp/shmcache-<uid>        (0700)
//   socket      <run dir>/shmcached-<port>.sock                 (0600)
//   lock        <run dir>/shmcached-<port>.lock  (flock: one daemon)
//   host lock   /dev/shm/.shmcache.<uid>.<port>.lock (flock: one daemon of
//               a (user, port) on the host, whatever its run dir; the shm
//               files of two would carry the same names). It names the
//               holder's pid, run dir and shm dir (common/instance_lock.h)
//   shm files   <shm dir>/shmcache.<uid>.<port>.*               (0600)
//   shm dir     --shm_dir, $SHMCACHE_SHM_DIR, else the server's own
//               huge-page tmpfs <huge dir> when it can mount one
//               (daemon/huge_tmpfs.h), else /dev/shm. Clients learn the
//               prefix of the files from the server (hello).
//   huge dir    /dev/shm/shmcache.<uid>.<port>.huge             (0700)
//
// The shm files of an instance, after the prefix, and what each holds:
// layout.h. InstancePaths writes their names and ParseShmName reads them.
// Cache ids and table tags are random, so that another user cannot take
// the name of a file the server is about to create.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "shmcache/status.h"

namespace shmcache {

struct InstancePaths {
  int port = 0;
  std::string run_dir;
  std::string socket_path;
  std::string lock_path;
  std::string shm_dir;
  std::string shm_prefix;  // full path prefix of the shm files

  std::string CacheFile(uint32_t cache_id) const;
  std::string TableFile(uint32_t cache_id, uint32_t gen, uint32_t tag) const;
  std::string SegmentFile(uint32_t cache_id, uint32_t seg_no) const;
  std::string SessionsFile() const;
  // The daemon's record of the spill database the index points to.
  std::string SpillRecordFile() const;
  // A connection's staging file for spilled rows of a cache (protocol.h,
  // kSpillStage): the daemon's, removed when the connection ends.
  std::string StageFile(uint32_t cache_id, uint32_t tag) const;
};

// A name in the shm dir, its instance prefix removed, read back.
struct ShmName {
  enum class Kind {
    kCache,
    kTable,
    kSegment,
    kStage,
    kSessions,
    kSpillRecord,
    kHugeDir,
    kOther
  };
  Kind kind = Kind::kOther;
  uint32_t cache_id = 0;
  uint32_t number = 0;  // table generation or segment number
  uint32_t tag = 0;     // table or stage tag
};
// kOther for anything InstancePaths would not have written (numbers out of
// range, leading zeros, trailing bytes).
ShmName ParseShmName(std::string_view rest);

// requested > 0: checked against 1025..65535. 0: $SHMCACHE_PORT when set
// (an empty one is refused, as `-p ''` is), else the default. A bad value is
// InvalidArgument naming it (and the variable) and the valid range.
Status ResolvePort(int requested, int* port);
// Parses a port given as text (CLI, environment): digits alone, without
// white space, a '+' or a leading zero (named in the refusal).
Status ParsePort(const std::string& text, int* port);
// " -p <port>" for a shmcache command a message suggests, so that it asks
// the server on `port`; "" for the default port (and 0, none known).
std::string PortArg(int port);
// host empty: $SHMCACHE_HOST (refused when set but empty), else local. Only 127.0.0.1,
// localhost and ::1 are accepted; anything else is InvalidArgument (one of them with
// white space around it says so).
Status CheckHost(const std::string& host);

// $SHMCACHE_RUN_DIR / $SHMCACHE_SHM_DIR as set ("" when set but empty,
// which the checks below refuse), else /tmp/shmcache-<uid> / /dev/shm.
std::string DefaultRunDir();
std::string DefaultShmDir();
// Where a server with no --shm_dir mounts its huge-page tmpfs: a name of the
// instance's own in /dev/shm ("<prefix>huge"), so that whatever lists an
// instance's files there sees it too.
std::string HugeShmDir(int port);
// The host-wide lock of this user's instance `port` (see above). Outside
// the instance's "shmcache.<uid>.<port>." names, so that nothing that lists
// or removes an instance's files takes it for one of them.
std::string HostLockPath(int port);
InstancePaths MakeInstancePaths(int port, const std::string& run_dir,
                                const std::string& shm_dir);
// InvalidArgument naming the path, its length and the fix when the socket
// path does not fit in sockaddr_un::sun_path (107 bytes on Linux).
Status CheckSocketPath(const std::string& socket_path);
// InvalidArgument naming the dir and the fix when a run dir (from
// $SHMCACHE_RUN_DIR or the options) is not an absolute path (an empty one
// is a variable set but empty, said so): the socket in
// it would be found only from the working directory the server was started
// in, and every client elsewhere would call the server not running.
Status CheckRunDir(const std::string& run_dir);
// The same for the shm dir of $SHMCACHE_SHM_DIR: the server hands clients
// its files' paths, which would not resolve from another directory.
Status CheckShmDirFromEnv(const std::string& shm_dir);
// Creates the run dir 0700 if missing (OpenOwnedDir, owned_dir.h): a link
// there (another user's in /tmp, which could later lead clients to her
// socket), another user's directory, or one others may write is
// PermissionDenied naming what is there and the fix; one of ours that
// others may only read is made 0700.
Status EnsureRunDir(const std::string& dir);
// The same checks without creating it: OK when it is missing (no server
// made it yet) or this user's own; else EnsureRunDir's PermissionDenied,
// which a start there would give too.
Status CheckOwnRunDir(const std::string& dir);

}  // namespace shmcache
