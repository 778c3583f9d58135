// HugeTmpfs: the shm dir of a server started with SHMCACHE_HUGE_TMPFS=1 and
// without --shm_dir (nor $SHMCACHE_SHM_DIR). Filling a cold cache is bound
// by the kernel's cost per tmpfs page (shm_pages.h); on a tmpfs with huge
// pages puts of 3 KB rows ran 1-2 M rows/s against 0.5-0.6 M on 4 KB
// pages, but not reliably: on this project's shared VM the same benchmark
// on a fresh huge tmpfs also ran at 0.12-0.4 M rows/s (free 2 MB blocks
// that the VM's host had taken back: docs/performance.md, "Puts on huge
// pages: the first fill"), and a first DataLoader epoch was slower. So
// it is asked for, not the default. When asked, the server picks, in this
// order:
//
//  1. /dev/shm itself when its pages are huge already;
//  2. its own tmpfs at HugeShmDir(port) = /dev/shm/shmcache.<uid>.<port>.huge,
//     mounted  -o huge=within_size,mode=0700,uid=<euid>,gid=<egid>,
//     size=HugeTmpfsBytes(cap),nosuid,nodev,noexec  when the process has
//     CAP_SYS_ADMIN (root) and the kernel has shmem transparent huge pages
//     (/sys/kernel/mm/transparent_hugepage/shmem_enabled present, not
//     "deny"). A huge tmpfs already mounted there (left by a server that was
//     killed) is adopted with its files, and resized to this server's cap;
//     rows a killed server of the other mode left in /dev/shm are moved
//     into it before adoption (shm_dir_switch.h);
//  3. else /dev/shm (4 KB pages), with one log line saying why and how to
//     get huge pages.
//
// The mount point is created 0700 in /dev/shm (world-writable, sticky) and
// used only through a descriptor opened O_NOFOLLOW | O_DIRECTORY: a symlink
// or a file at that name is never followed, and a directory (or a mount)
// of another owner or open to others is never used; the server then falls
// back to /dev/shm and says so (also as a NOTE of `shmcache --start`).
// The tmpfs size is a second guard under the memory cap: a full tmpfs makes
// posix_fallocate fail with ENOSPC before any page is written (Full, never
// SIGBUS; see ShmFile::Create).
// A clean stop unmounts it (lazily when some process still maps a file in
// it) and removes the directory. A killed server leaves the mount, and
// its rows, to the next server of the port (or to the Slurm epilog); when
// that one uses /dev/shm (not asked, or it cannot have its own), it moves
// the rows out and unmounts the mount (shm_dir_switch.h). A start refused
// after it mounted (or adopted) it unmounts it when nothing of the
// instance is in it (daemon/main.cc).
// Thread safety: call from one thread at start-up and shutdown.
#pragma once

#include <cstdint>
#include <string>

#include "shmcache/status.h"

namespace shmcache {

struct ShmDirChoice {
  std::string dir;
  bool huge = false;
  bool own_mount = false;    // the server's tmpfs: unmount at a clean stop
  std::string log_line;      // one line for the start-up log
  std::string note;          // non-empty: something is wrong at the mount
                             // path; also a NOTE for `shmcache --start`
  std::string why_not_huge;  // asked for, but no huge tmpfs: the reason
};

// Whether the user named the shm dir (a non-empty --shm_dir, or
// $SHMCACHE_SHM_DIR set): then the server never mounts anything.
bool ShmDirGiven(const std::string& shm_dir_option);

// Whether $SHMCACHE_HUGE_TMPFS asks for the server's own huge-page tmpfs
// ("1"; unset or "0": no). Any other value is refused by
// CheckHugeTmpfsEnv, which the server calls before it reads this.
bool HugeTmpfsAsked();

// InvalidArgument naming $SHMCACHE_HUGE_TMPFS, what was wrong with it and
// what to give, unless it is unset, "0" or "1" exactly ("yes", "" and " 1"
// were read as on, "false" too).
Status CheckHugeTmpfsEnv();

// tmpfs size for a server whose memory cap is `memory_cap`: the cap (every
// segment, table and header is reserved under it) and 64 MB for the
// sessions and spill record files, rounded up to 2 MB.
uint64_t HugeTmpfsBytes(uint64_t memory_cap);

// Picks the shm dir as above, mounting when it can. Never fails: the
// fallback is /dev/shm.
ShmDirChoice ChooseShmDir(int port, uint64_t tmpfs_bytes);

// Unmounts the server's tmpfs at `dir` (MNT_DETACH when busy) and removes
// the directory. The error says what is left behind.
Status ReleaseHugeShmDir(const std::string& dir);

}  // namespace shmcache
