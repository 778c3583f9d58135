// Fuzz target: the validators of shared-memory files. The input becomes the
// files a dead daemon left (cache header, index table, data segment,
// sessions list); a fresh Store adopts them through the real path
// (CheckFileHeader, then the header, table and segment geometry checks of
// CacheState::Adopt) and serves from what it accepted. Whatever it cannot
// trust must be discarded, never read out of bounds.
//
// Input: u32 cache_len | u32 table_len | u32 seg_len | cache bytes | table
// bytes | segment bytes | sessions text (the rest). Lengths are clamped.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "format/layout.h"
#include "tests/fuzz/fuzz_common.h"

using namespace shmcache;

namespace {

void WriteFile(const std::string& path, std::span<const uint8_t> bytes) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = write(fd, bytes.data() + done, bytes.size() - done);
    if (w <= 0) std::abort();
    done += static_cast<size_t>(w);
  }
  close(fd);
}

uint32_t TakeLen(std::span<const uint8_t>& in) {
  uint32_t v = 0;
  if (in.size() >= 4) {
    std::memcpy(&v, in.data(), 4);
    in = in.subspan(4);
  }
  return v;
}

std::span<const uint8_t> Take(std::span<const uint8_t>& in, uint32_t n) {
  n = std::min<uint32_t>(n, static_cast<uint32_t>(in.size()));
  auto out = in.first(n);
  in = in.subspan(n);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& env = fuzz::Env();
  std::span<const uint8_t> in(data, size);
  uint32_t cache_len = TakeLen(in), table_len = TakeLen(in), seg_len = TakeLen(in);
  auto cache = Take(in, cache_len), table = Take(in, table_len), seg = Take(in, seg_len),
       sessions = in;

  // The common header check on its own, for every kind of file.
  for (auto bytes : {cache, table, seg}) {
    std::vector<uint64_t> aligned((bytes.size() + 7) / 8);
    if (!bytes.empty()) std::memcpy(aligned.data(), bytes.data(), bytes.size());
    for (auto [magic, hsize] :
         {std::pair{layout::kCacheMagic, sizeof(layout::CacheHeader)},
          std::pair{layout::kTableMagic, sizeof(layout::TableHeader)},
          std::pair{layout::kSegmentMagic, sizeof(layout::SegmentHeader)}}) {
      layout::CheckFileHeader(aligned.data(), bytes.size(), magic, hsize);
    }
  }

  const InstancePaths& p = env.paths;
  const std::string files[] = {p.CacheFile(1), p.TableFile(1, 0, 0), p.SegmentFile(1, 0),
                               p.SessionsFile()};
  WriteFile(files[0], cache);
  WriteFile(files[1], table);
  WriteFile(files[2], seg);
  WriteFile(files[3], sessions);
  {
    std::unique_ptr<Store> store = env.NewStore();
    if (store->Init().ok()) {
      std::vector<SessionInfo> list;
      store->ListSessions(&list);
      ChunkLease lease;
      if (store->LeaseChunk(1, 1, 0, 256, &lease).ok()) {
        store->ReturnChunk(1, 1, lease.seg_no, lease.offset).PermitUncheckedError();
      }
      store->GrowIndex(1, 1).PermitUncheckedError();
      store->ReleaseConnection(1, nullptr);  // no process: the peer is gone
      store->Shutdown();
    }
  }
  for (const std::string& f : files) unlink(f.c_str());
  return 0;
}
