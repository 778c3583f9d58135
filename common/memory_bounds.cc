#include "common/memory_bounds.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "common/option_checks.h"

namespace shmcache {

namespace {

// v1 writes "no limit" as a huge page-rounded number (9223372036854771712).
constexpr uint64_t kNoLimitAbove = uint64_t{1} << 62;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

// A limit file's value; 0 for "max", unreadable or no limit.
uint64_t ReadLimit(const std::string& path) {
  std::string text = ReadFile(path);
  if (text.empty() || text.rfind("max", 0) == 0) return 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || v >= kNoLimitAbove) return 0;
  return v;
}

struct Hierarchy {
  std::string mount_root;  // the cgroup path the mount shows at its top
  std::string mount_point;
};

// Where the v2 hierarchy (`v2`) or the v1 memory hierarchy is mounted.
bool FindMount(const std::string& mountinfo, bool v2, Hierarchy* out) {
  for (const std::string& line : Split(mountinfo, '\n')) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash));
    std::istringstream tail(line.substr(dash + 3));
    std::string id, parent, dev, root, point, fstype, source, opts;
    head >> id >> parent >> dev >> root >> point;
    tail >> fstype >> source >> opts;
    bool match = v2 ? fstype == "cgroup2"
                    : fstype == "cgroup" &&
                          std::ranges::count(Split(opts, ','), std::string("memory")) > 0;
    if (match) {
      *out = {root, point};
      return true;
    }
  }
  return false;
}

// The smallest limit in `file_name` from `path` (a cgroup path as
// /proc/self/cgroup shows it) up to the top of the mount.
uint64_t SmallestUpwards(const std::string& root, const Hierarchy& h, std::string path,
                         const char* file_name, std::string* file) {
  if (h.mount_root != "/" && path.rfind(h.mount_root, 0) == 0) {
    path = path.substr(h.mount_root.size());
  }
  uint64_t best = 0;
  for (;;) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    std::string dir = root + h.mount_point + (path == "/" ? "" : path);
    std::string f = dir + "/" + file_name;
    uint64_t v = ReadLimit(f);
    if (v && (best == 0 || v < best)) {
      best = v;
      if (file) *file = f.substr(root.size());
    }
    if (path.empty() || path == "/") break;
    size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return best;
}

}  // namespace

uint64_t CgroupMemoryLimit(const std::string& root, std::string* file) {
  std::string mountinfo = ReadFile(root + "/proc/self/mountinfo");
  uint64_t best = 0;
  for (const std::string& line : Split(ReadFile(root + "/proc/self/cgroup"), '\n')) {
    // hierarchy-id:controllers:path; v2 is "0::path".
    size_t a = line.find(':');
    size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    bool v2 = line.substr(0, a) == "0" && controllers.empty();
    bool v1_memory =
        std::ranges::count(Split(controllers, ','), std::string("memory")) > 0;
    if (!v2 && !v1_memory) continue;
    Hierarchy h;
    if (!FindMount(mountinfo, v2, &h)) continue;
    std::string f;
    uint64_t v =
        SmallestUpwards(root, h, path, v2 ? "memory.max" : "memory.limit_in_bytes", &f);
    if (v && (best == 0 || v < best)) {
      best = v;
      if (file) *file = f;
    }
  }
  return best;
}

MemoryBounds ComputeMemoryBounds(double ratio, uint64_t cap_bytes, uint64_t shm_room,
                                 const std::string& root) {
  MemoryBounds b;
  b.requested_bytes = MemoryCapBytes(ratio, cap_bytes);
  b.requested = cap_bytes ? kBoundCapMb : kBoundPhysical;
  b.cgroup_limit_bytes = CgroupMemoryLimit(root, &b.cgroup_file);
  // The ratio applies to a cgroup limit even under --memory_cap_mb: the
  // server and its clients need the rest of the limit for their own pages.
  b.cgroup_bytes =
      static_cast<uint64_t>(static_cast<double>(b.cgroup_limit_bytes) * ratio);
  b.shm_bytes = shm_room;
  b.cap_bytes = b.requested_bytes;
  b.bound = b.requested;
  if (b.cgroup_bytes && b.cgroup_bytes < b.cap_bytes) {
    b.cap_bytes = b.cgroup_bytes;
    b.bound = kBoundCgroup;
  }
  if (b.shm_bytes < b.cap_bytes) {
    b.cap_bytes = b.shm_bytes;
    b.bound = kBoundShm;
  }
  return b;
}

std::string ContainerKind(const std::string& root) {
  const char* k8s = std::getenv("KUBERNETES_SERVICE_HOST");
  if (k8s && *k8s) return "kubernetes";
  std::string cg = ReadFile(root + "/proc/1/cgroup");
  if (cg.find("kubepods") != std::string::npos) return "kubernetes";
  if (access((root + "/.dockerenv").c_str(), F_OK) == 0 ||
      cg.find("/docker") != std::string::npos ||
      cg.find("containerd") != std::string::npos) {
    return "docker";
  }
  return "";
}

std::string ShmTooSmallRemedy(const std::string& shm_dir, uint64_t room, uint64_t wanted,
                              const std::string& what, const std::string& container) {
  // Rounded up to a GB with a GB to spare: what the remedy should ask for.
  uint64_t gb = ((wanted + (1ull << 30) - 1) >> 30) + 1;
  std::string head = fmt::format(
      "the shm filesystem {} has {} MB of room, less than the {} MB of {}; the "
      "memory cap is {} MB. ",
      shm_dir, room >> 20, wanted >> 20, what, room >> 20);
  if (container == "kubernetes") {
    return head +
           fmt::format(
               "Mount an emptyDir volume with 'medium: Memory' and 'sizeLimit: {}Gi' at "
               "/dev/shm in the pod spec (and raise the container's memory limit to "
               "match), "
               "or start with --shm_dir on a larger tmpfs",
               gb);
  }
  if (container == "docker") {
    return head + fmt::format(
                      "Run the container with 'docker run --shm-size={}g ...' (compose: "
                      "shm_size: {}gb), or start with --shm_dir on a larger tmpfs",
                      gb, gb);
  }
  return head + fmt::format(
                    "Start with --shm_dir DIR on a larger tmpfs (e.g. 'mount -t tmpfs -o "
                    "size={}g "
                    "tmpfs DIR'), or give a smaller -r / --memory_cap_mb",
                    gb);
}

}  // namespace shmcache
