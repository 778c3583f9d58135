#include "daemon/shm_dir_switch.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "daemon/huge_tmpfs.h"
#include "daemon/logger.h"
#include "daemon/replace_file.h"
#include "daemon/shm_pages.h"
#include "format/align.h"
#include "format/instance.h"
#include "format/layout.h"
#include "format/numa_topology.h"
#include "format/owned_dir.h"
#include "format/shm_file.h"

namespace shmcache {
namespace {

constexpr const char* kDevShm = "/dev/shm";

// The instance's files in one dir, by what they are. Names are relative
// to the dir.
struct Listing {
  // cache id -> (kind order, number, name): header, tables, segments.
  std::map<uint32_t, std::vector<std::tuple<int, uint32_t, std::string>>> caches;
  std::vector<std::string> records;  // sessions list, spill record
  std::vector<std::string> strays;   // names of the instance nobody writes
};

Listing ListInstance(const std::string& dir, const std::string& base) {
  Listing l;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return l;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, base.c_str(), base.size()) != 0) continue;
    std::string name = e->d_name;
    ShmName n = ParseShmName(std::string_view(name).substr(base.size()));
    using Kind = ShmName::Kind;
    switch (n.kind) {
      case Kind::kHugeDir: break;  // the huge dir itself, in /dev/shm
      case Kind::kSessions:
      case Kind::kSpillRecord: l.records.push_back(name); break;
      case Kind::kCache: l.caches[n.cache_id].emplace_back(0, 0, name); break;
      case Kind::kTable: l.caches[n.cache_id].emplace_back(1, n.number, name); break;
      case Kind::kSegment: l.caches[n.cache_id].emplace_back(2, n.number, name); break;
      default: l.strays.push_back(name);
    }
  }
  closedir(d);
  for (auto& [id, files] : l.caches) std::sort(files.begin(), files.end());
  return l;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

Status ReadOwned(const std::string& path, std::string* text) {
  int fd = -1;
  size_t size = 0;
  Status s = OpenOwnedFile(path, O_RDONLY, &fd, &size);
  if (!s.ok()) return s;
  text->resize(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = pread(fd, text->data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
  text->resize(done);
  return Status::OK();
}

// The sessions list and the spill record: small text files. Two sessions
// lists are merged (the reader takes every id it finds); of two spill
// records, this server's place keeps its own. The earlier one is removed
// only once its text is in place here.
Status MoveRecord(const std::string& from, const std::string& to, bool sessions) {
  std::string text, here;
  Status s = ReadOwned(from, &text);
  if (s.ok() && Exists(to)) {
    if (!sessions) return ShmFile::Unlink(from);
    s = ReadOwned(to, &here);
    text = here + "\n" + text;
  }
  if (s.ok()) s = ReplaceFile(to, text, 0600);
  if (!s.ok()) return s;
  return ShmFile::Unlink(from);
}

// Whether `to` is a whole copy of `from` that a start killed after linking
// it left: a file of ours as Create makes them, of the same size.
bool IsCopyOf(const std::string& to, size_t size) {
  struct stat st {};
  return lstat(to.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
         (st.st_mode & 07777) == 0600 && st.st_nlink == 1 &&
         static_cast<size_t>(st.st_size) == size;
}

// Copies the open file `in` (`size` bytes) to the new name `to` in `dir`:
// its first `copy` bytes, the rest left a hole (a segment's pages past its
// carve mark, which the earlier server may not have supplied and no row
// lies in; see SuppliedPart).
// The copy is made as a file with no name (O_TMPFILE), so that no
// temporary name exists for anyone to take ahead of it or to find half
// written; it gets its name only once whole, by linkat, which never
// replaces what is there. The room of what is copied is reserved first (no
// room is an error here, never a SIGBUS later; pages bound to `node` when
// >= 0, as ShmFile::Create does), then filled by sendfile: the kernel
// copies page to page, with no page fault and no zeroing first.
Status CopyTo(int in, const std::string& dir, const std::string& to, size_t size,
              size_t copy, int node) {
  int out = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (out < 0) return Status::FromErrno("cannot create a file in " + dir, errno);
  Status s;
  if (fchmod(out, 0600) != 0 || ftruncate(out, static_cast<off_t>(size)) != 0) {
    s = Status::FromErrno("cannot size a copy for " + to, errno);
  }
  if (s.ok() && node >= 0 && size > 0) {
    // tmpfs allocates by the file's shared policy, which mbind on a shared
    // mapping sets (and which stays after munmap).
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, out, 0);
    if (p != MAP_FAILED) {
      NumaTopology::Get().BindMemory(p, size, node);
      munmap(p, size);
    }
  }
  if (int err =
          s.ok() && copy > 0 ? posix_fallocate(out, 0, static_cast<off_t>(copy)) : 0;
      err != 0) {
    s = err == ENOSPC ? Status::FullNoShmRoom(fmt::format("no room in {} for {} MB", dir,
                                                          (copy + (1 << 20) - 1) >> 20))
                      : Status::FromErrno("cannot reserve a copy for " + to, err);
  }
  off_t off = 0;
  while (s.ok() && static_cast<size_t>(off) < copy) {
    ssize_t n = sendfile(out, in, &off, copy - static_cast<size_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) s = Status::FromErrno("cannot copy into " + to, n < 0 ? errno : EIO);
  }
  // Linking a descriptor by /proc/self/fd asks for no privilege (linkat's
  // AT_EMPTY_PATH does).
  if (s.ok() && linkat(AT_FDCWD, fmt::format("/proc/self/fd/{}", out).c_str(), AT_FDCWD,
                       to.c_str(), AT_SYMLINK_FOLLOW) != 0) {
    int e = errno;
    s = e == EEXIST
            ? Status::AlreadyExists(fmt::format(
                  "{} exists and is not a copy of the earlier server's file ({}): "
                  "not replaced",
                  to, DescribeEntry(to)))
            : Status::FromErrno("cannot name the copy " + to, e);
  }
  close(out);
  return s;
}

// The part of a segment file of `size` bytes whose header `h` (its first
// bytes) says is carved, in whole 2 MB pages (huge ones on a huge tmpfs):
// every row lies below the carve mark, and the pages past it are the
// earlier server's supply ahead (or its holes), which the adopting server
// counts as not supplied and supplies again before it leases them
// (SegmentAllocator::AdoptSegment). A header that is not a finished
// segment's, or a carve mark out of range, gives the whole file: adoption
// then judges it (removes a segment never finished, refuses one whose
// header is bad) as it would where it was.
size_t SuppliedPart(const layout::SegmentHeader& h, size_t size) {
  const uint64_t carved = h.carved.load();
  if (h.file.magic != layout::kSegmentMagic || carved < layout::kSegmentHeaderSize ||
      carved > size) {
    return size;
  }
  return static_cast<size_t>(std::min<uint64_t>(size, AlignUp(carved, kHugePageBytes)));
}

// Copies `from` to `to` (in `dir`), unless a killed start copied it whole
// already; *copied: the bytes copied (a segment's carved part, see
// SuppliedPart; a whole file otherwise). `from` stays: the caller removes
// the sources once every file of their cache is copied.
Status CopyFile(const std::string& from, const std::string& dir, const std::string& to,
                bool segment, uint64_t* copied) {
  int fd = -1;
  size_t size = 0;
  Status s = OpenOwnedFile(from, O_RDONLY, &fd, &size);
  if (!s.ok()) return s;
  int node = -1;
  size_t copy = size;
  if (segment) {
    alignas(layout::SegmentHeader) unsigned char buf[sizeof(layout::SegmentHeader)];
    if (pread(fd, buf, sizeof(buf), 0) == static_cast<ssize_t>(sizeof(buf))) {
      const auto* h = reinterpret_cast<const layout::SegmentHeader*>(buf);
      if (h->node < static_cast<uint32_t>(NumaTopology::Get().num_nodes())) {
        node = static_cast<int>(h->node);
      }
      copy = SuppliedPart(*h, size);
    }
  }
  if (!IsCopyOf(to, size)) s = CopyTo(fd, dir, to, size, copy, node);
  close(fd);
  if (s.ok()) *copied += copy;
  return s;
}

// Whether `dir` has room for a cache's files at their full sizes: what
// adoption reserves for them and the supply may allocate there (segments
// are copied sparse, but their holes are theirs). A cache that does not
// fit stays whole where it was, as when its copy found no room: moved, it
// would be over the cap that this room bounds, and adoption would discard
// it. `holes`: those of the caches moved before it, still to be supplied
// out of the free room. *need: the pages this cache still takes there,
// holes included.
Status RoomForCache(const std::vector<std::tuple<int, uint32_t, std::string>>& files,
                    const std::function<std::string(const std::string&)>& src,
                    const std::function<std::string(const std::string&)>& dst,
                    const std::string& dir, uint64_t holes, uint64_t* need) {
  *need = 0;
  for (const auto& [kind, number, name] : files) {
    struct stat from {
    }, to{};
    if (lstat(src(name).c_str(), &from) != 0) continue;
    const auto size = static_cast<uint64_t>(from.st_size);
    const uint64_t there = lstat(dst(name).c_str(), &to) == 0 && IsCopyOf(dst(name), size)
                               ? static_cast<uint64_t>(to.st_blocks) * 512
                               : 0;
    *need += size - std::min(size, there);
  }
  const uint64_t free_bytes = FreeBytes(dir);
  const uint64_t room = free_bytes - std::min(free_bytes, holes);
  if (*need > room) {
    return Status::FullNoShmRoom(fmt::format("no room in {} for {} MB ({} MB free)", dir,
                                             (*need + (1 << 20) - 1) >> 20, room >> 20));
  }
  return Status::OK();
}

// The huge dir when it is a directory of this user, closed to others (what
// ChooseShmDir would use): then it is this instance's. *mounted: whether a
// file system is mounted there.
bool OwnHugeDir(const std::string& dir, bool* mounted) {
  struct stat st {
  }, shm{};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0 || stat(kDevShm, &shm) != 0) {
    return false;
  }
  *mounted = st.st_dev != shm.st_dev;
  return true;
}

// Unmounts (or removes) the emptied huge dir: "" or what is left and why.
std::string ReleaseEarlierHugeDir(const std::string& dir, bool mounted) {
  if (mounted && umount2(dir.c_str(), UMOUNT_NOFOLLOW) != 0 &&
      umount2(dir.c_str(), UMOUNT_NOFOLLOW | MNT_DETACH) != 0) {
    return fmt::format("{} stays mounted, empty ({}): umount {} as root", dir,
                       std::strerror(errno), dir);
  }
  if (rmdir(dir.c_str()) != 0) {
    return fmt::format("cannot remove {}: {}", dir, std::strerror(errno));
  }
  return "";
}

// Why the two servers used different places, and how to keep one.
std::string Reason(bool from_huge, bool huge, const std::string& why_not_huge) {
  constexpr const char* kKeep =
      "to keep one mode across restarts, give every start the same "
      "SHMCACHE_HUGE_TMPFS (SHMCACHE_HUGE_TMPFS=1 in the systemd unit's "
      "shmcache/shmcached-PORT.conf or an Environment= line, sudo -E or sudo "
      "SHMCACHE_HUGE_TMPFS=1 shmcache --start)";
  if (!from_huge) {
    return fmt::format("It ran without SHMCACHE_HUGE_TMPFS, this server with it; {}.",
                       kKeep);
  }
  if (huge) return "This server uses /dev/shm, whose pages are huge.";
  if (!why_not_huge.empty()) {
    return fmt::format("This server has {}no huge-page tmpfs of its own: {}.",
                       HugeTmpfsAsked() ? "SHMCACHE_HUGE_TMPFS set but " : "",
                       why_not_huge);
  }
  return fmt::format("It ran with SHMCACHE_HUGE_TMPFS, this server without; {}.", kKeep);
}

}  // namespace

ShmDirSwitch MoveEarlierShmFiles(int port, const std::string& dir, bool huge,
                                 const std::string& why_not_huge,
                                 const std::atomic<bool>* stop_requested, Logger* log) {
  ShmDirSwitch r;
  const std::string huge_dir = HugeShmDir(port);
  bool from_huge = dir == kDevShm;
  if (!from_huge && dir != huge_dir) return r;
  r.from = from_huge ? huge_dir : kDevShm;
  bool mounted = false;
  if (from_huge && !OwnHugeDir(huge_dir, &mounted)) return r;

  const InstancePaths here = MakeInstancePaths(port, "", dir);
  const std::string base = here.shm_prefix.substr(dir.size() + 1);
  Listing found = ListInstance(r.from, base);
  auto src = [&](const std::string& name) { return r.from + "/" + name; };
  auto dst = [&](const std::string& name) { return dir + "/" + name; };
  for (const std::string& name : found.strays) {
    log->Warn("removing {}: not a file this server writes", src(name));
    unlink(src(name).c_str());
  }
  if (found.caches.empty() && found.records.empty()) {
    if (!from_huge) return r;
    // An empty mount (a start that failed, a stopped move): holds nothing.
    std::string left = ReleaseEarlierHugeDir(huge_dir, mounted);
    if (left.empty()) {
      log->Info("removed the empty huge-page tmpfs an earlier server left at {}",
                huge_dir);
      return r;
    }
    r.warning =
        fmt::format("an earlier server of port {} left {}; {}", port, huge_dir, left);
    log->Warn("{}", r.warning);
    return r;
  }

  std::string first_error;
  for (const std::string& name : found.records) {
    Status s = MoveRecord(src(name), dst(name), name == base + "sessions");
    if (!s.ok()) {
      log->Warn("{} of the earlier server not moved (it stays there): {}", src(name),
                s.message());
    }
  }
  bool stopped = false;
  uint64_t holes = 0;  // of the caches moved so far (see RoomForCache)
  for (const auto& [id, files] : found.caches) {
    if (stop_requested != nullptr && stop_requested->load()) {
      stopped = true;
      break;
    }
    uint64_t bytes = 0, need = 0;
    Status s = RoomForCache(files, src, dst, dir, holes, &need);
    for (const auto& [kind, number, name] : files) {
      if (!s.ok()) break;
      s = CopyFile(src(name), dir, dst(name), kind == 2, &bytes);
    }
    if (s.ok()) {
      // Every file is whole in both places: the earlier ones go.
      for (const auto& [kind, number, name] : files) unlink(src(name).c_str());
      ++r.caches;
      r.bytes += bytes;
      holes += need - std::min(need, bytes);
      continue;
    }
    // Half a cache is no cache: the copies made go, and the earlier files,
    // the only whole copy, stay where they are for a later start.
    ++r.not_moved;
    if (first_error.empty()) first_error = s.message();
    log->Warn("cache {} of the earlier server not moved to {}, left in {}: {}", id, dir,
              r.from, s.message());
    for (const auto& [kind, number, name] : files) {
      struct stat st {};
      if (lstat(src(name).c_str(), &st) == 0 &&
          IsCopyOf(dst(name), static_cast<size_t>(st.st_size))) {
        unlink(dst(name).c_str());
      }
    }
  }

  std::string what = fmt::format("an earlier server of port {} left ", port);
  if (found.caches.empty()) {
    what += fmt::format("its sessions, no cache, in {}: moved them to {}", r.from, dir);
  } else {
    what += fmt::format("{} cache(s) in {}: ", found.caches.size(), r.from);
    if (r.caches > 0) {
      what += fmt::format("moved {} ({} MB) to {}",
                          r.not_moved > 0 ? "the others" : "them", r.bytes >> 20, dir);
    }
    if (r.not_moved > 0) {
      what += fmt::format(
          "{}left {} that could not be moved to {} ({}) where they are: a start in the "
          "earlier mode serves them, a later start in this one moves them once it can",
          r.caches > 0 ? "; " : "", r.not_moved, dir, first_error);
    }
  }
  if (stopped) {
    what += "; stopped before the rest: the next start moves it";
  } else if (from_huge && r.not_moved == 0) {
    std::string left = ReleaseEarlierHugeDir(huge_dir, mounted);
    what += left.empty() ? fmt::format(" and unmounted {}", huge_dir) : "; " + left;
  }
  r.warning = fmt::format("{}. {}", what, Reason(from_huge, huge, why_not_huge));
  log->Warn("{}", r.warning);
  return r;
}

}  // namespace shmcache
