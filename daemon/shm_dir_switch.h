// ShmDirSwitch: a server of a port started without --shm_dir keeps its
// files in one of two places: /dev/shm, or its own huge-page tmpfs at
// HugeShmDir(port) when SHMCACHE_HUGE_TMPFS asks for one (huge_tmpfs.h).
// The variable is easily lost between a killed server and the next start
// (sudo without -E, a systemd unit without Environment=), and the earlier
// server's rows then lie in the place this server does not use.
//
// MoveEarlierShmFiles, called after the instance's host lock is held (so no
// live server of the port owns those files) and before adoption, moves the
// instance's files from the other place into this server's shm dir, where
// adoption finds them as after any kill. Rows stay readable and everything
// is in the new mode afterwards; --stop then removes them from the one
// place. The earlier huge tmpfs, emptied, is unmounted and removed.
//
// Each file is copied as a file with no name (O_TMPFILE: there is no
// temporary name another user could take ahead of it, as a fixed one in
// /dev/shm could be) and linked in under its own name once whole, never
// over something already there; the earlier files of a cache are removed
// only once every one of them is copied. So a server killed while moving
// leaves each file whole in the earlier place, and the next start goes on
// where it stopped. Per cache the header and tables move before the
// segments: a row in a moved table was written whole before the table was
// copied, so its bytes are in the segment copied after it, even when a
// client of the dead server is still writing. A cache that cannot be moved
// (no room for its files at their full sizes, which adoption reserves; a
// name taken by something not ours) loses only the copies made:
// it stays whole where it was (a huge tmpfs holding one stays mounted), for
// a start in the earlier mode or a later one that can move it.
//
// Of a segment only the carved part is copied (in whole 2 MB pages): the
// rest stays a hole, as the earlier server may have left it (pages are
// supplied a step ahead of the carve mark, segment_allocator.h), and
// adoption counts it as not supplied, so it is supplied again before a
// chunk is leased there: a move allocates what the rows take, not the
// segments' sizes, and no process touches a hole.
// Thread safety: call from one thread at start-up.
#pragma once

#include <atomic>
#include <string>

namespace shmcache {

class Logger;

struct ShmDirSwitch {
  std::string from;     // the other place, where the earlier server's files were
  int caches = 0;       // caches moved
  uint64_t bytes = 0;   // copied (of a segment, its carved part; see below)
  int not_moved = 0;    // caches that could not be moved: left where they were
  std::string warning;  // for `shmcache --start` ("Warning: ..."); "" if
                        // nothing of an earlier server was found
};

// `dir`: the shm dir this server uses (`huge`: whether its pages are
// huge); `why_not_huge`: why it is not its own huge tmpfs, when there is a
// reason to give (asked for but not to be had, or a shm dir given). Does
// nothing unless `dir` is /dev/shm or HugeShmDir(port). Stops between
// files when *stop_requested turns true; what is left stays for the next
// start.
ShmDirSwitch MoveEarlierShmFiles(int port, const std::string& dir, bool huge,
                                 const std::string& why_not_huge,
                                 const std::atomic<bool>* stop_requested, Logger* log);

}  // namespace shmcache
