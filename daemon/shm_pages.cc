#include "daemon/shm_pages.h"

#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace shmcache {
namespace {

bool Under(const std::string& dir, const std::string& mount_point) {
  if (mount_point == "/") return true;
  return dir.compare(0, mount_point.size(), mount_point) == 0 &&
         (dir.size() == mount_point.size() || dir[mount_point.size()] == '/');
}

}  // namespace

std::string ReadTextFile(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string MountOption(std::string_view opts, std::string_view key) {
  size_t pos = 0;
  while (pos <= opts.size()) {
    size_t end = opts.find(',', pos);
    if (end == std::string_view::npos) end = opts.size();
    std::string_view o = opts.substr(pos, end - pos);
    if (o.size() > key.size() && o.substr(0, key.size()) == key && o[key.size()] == '=') {
      return std::string(o.substr(key.size() + 1));
    }
    pos = end + 1;
  }
  return "";
}

bool HugeOption(const std::string& huge) {
  return huge == "always" || huge == "within_size" || huge == "advise";
}

MountEntry MountOf(const std::string& dir, std::string_view mounts) {
  // The last of equal mount points is the one on top.
  MountEntry m;
  std::istringstream lines{std::string(mounts)};
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string dev, mp, fstype, o;
    if (!(f >> dev >> mp >> fstype >> o)) continue;
    if (Under(dir, mp) && mp.size() >= m.point.size()) m = {mp, fstype, o};
  }
  return m;
}

ShmPages ShmPagesOf(const std::string& dir, std::string_view mounts,
                    std::string_view shmem_enabled) {
  // shmem_enabled reads like "always within_size advise [never] deny force".
  std::string global;
  if (size_t l = shmem_enabled.find('['); l != std::string_view::npos) {
    size_t r = shmem_enabled.find(']', l);
    if (r != std::string_view::npos) global = shmem_enabled.substr(l + 1, r - l - 1);
  }
  MountEntry m = MountOf(dir, mounts);
  // A mount not found (no /proc/self/mounts) is not taken for a disk.
  if (!m.type.empty() && m.type != "tmpfs") {
    return {false, m.type + ", not tmpfs", m.type != "ramfs"};
  }
  if (global == "force") return {true, "transparent huge pages forced for all tmpfs"};
  if (global == "deny") return {false, "transparent huge pages denied for all tmpfs"};
  if (m.type.empty()) return {false, "its mount was not found"};
  std::string huge = MountOption(m.options, "huge");
  if (HugeOption(huge)) return {true, "tmpfs mounted huge=" + huge};
  return {false, "tmpfs " + m.point + " mounted without huge pages"};
}

ShmPages ShmPagesOf(const std::string& dir) {
  char real[PATH_MAX];
  std::string resolved = realpath(dir.c_str(), real) ? real : dir;
  return ShmPagesOf(resolved, ReadTextFile(kMountsFile), ReadTextFile(kShmemEnabledFile));
}

std::string ShmPagesNote(const std::string& dir, const ShmPages& pages) {
  if (pages.huge) return fmt::format("shm dir {}: huge pages ({})", dir, pages.why);
  return fmt::format(
      "shm dir {}: 4 KB pages ({}); a cold cache fills about 3x faster on a "
      "tmpfs with huge pages: mount -t tmpfs -o size=SIZE,huge=within_size "
      "shmcache DIR, then start with --shm_dir DIR",
      dir, pages.why);
}

}  // namespace shmcache
