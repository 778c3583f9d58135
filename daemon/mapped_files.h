// Which files processes still map, read from /proc/<pid>/maps.
//
// A tmpfs file that was unlinked keeps its pages while any process maps it:
// a reader of a destroyed session, or a loader worker forked from one that
// never talked to the daemon. The daemon looks for such mappings to count
// that memory against its cap until it is really freed.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace shmcache {

// A file's identity: device and inode, as stat reports them and as
// /proc/<pid>/maps prints them.
struct FileId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  // clang-tidy 14 takes the defaulted <=>'s comparison with 0 for a null pointer.
  auto operator<=>(const FileId&) const = default;  // NOLINT(modernize-use-nullptr)
};

// The identity and size of the file at `path`; false when it cannot be
// stat'ed.
bool StatFile(const std::string& path, FileId* id, uint64_t* bytes);

struct MappedScan {
  std::set<FileId> mapped;   // the wanted files some process maps
  std::vector<int> holders;  // the processes found mapping them
};

// Which of `wanted`, all unlinked files, processes of this user still map
// (the files are 0600: nobody else can). Reads /proc/<pid>/maps of those
// processes, `first` first (the holders an earlier scan found), and stops
// once every file is found: while the same readers hold on, a scan reads
// only their maps. Without a readable /proc nothing is found. Call it
// without locks held.
MappedScan FindMappedDeleted(std::span<const FileId> wanted,
                             std::span<const int> first = {});

}  // namespace shmcache
