// The spill record: which spill database the spilled rows of an instance's
// index are in. A one-line text file beside the shared-memory files (it
// lives and dies with the index), written by the daemon at start before any
// row can spill, and removed at stop. A restarted daemon compares it with
// its own spill database to know whether the spilled rows it adopts can be
// read, and which database an earlier server left behind.
#pragma once

#include <string>

#include "format/instance.h"
#include "format/spill_format.h"
#include "shmcache/status.h"

namespace shmcache {

// <spill_dir>/shmcache.<uid>.<port>.spill, with spill_dir made absolute and
// free of symlinks, "." and "..", so that two spellings of one directory
// give one path.
std::string SpillDbPath(const std::string& spill_dir, int port);

// True when `path` is named as SpillDbPath names this instance's database:
// the only kind of directory a daemon destroys on a record's word.
bool IsSpillDbOf(const std::string& path, int port);

// True when a and b name one database: equal paths, or one directory.
bool SameSpillDb(const std::string& a, const std::string& b);

// ReadSpillRecord: format/spill_format.h (the clients read the record too).

// Records `db_path`, atomically (a temporary file renamed over the record);
// an empty path removes the record.
Status WriteSpillRecord(const InstancePaths& paths, const std::string& db_path);

}  // namespace shmcache
