// CacheImpl: attaching to a cache, its statistics, and closing it.

#include "lib/cache_impl.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "format/cache_stats.h"
#include "format/numa_topology.h"

namespace shmcache {

CacheImpl::CacheImpl(std::shared_ptr<ClientImpl> client, uint32_t cache_id,
                     uint32_t session_id, ShmFile header_file)
    : client_(std::move(client)),
      cache_id_(cache_id),
      session_id_(session_id),
      header_file_(std::move(header_file)),
      header_(reinterpret_cast<layout::CacheHeader*>(header_file_.data())),
      tables_(header_, cache_id, [c = client_.get()] { return c->paths(); }),
      segments_(cache_id, [c = client_.get()] { return c->paths(); }),
      stats_(header_, client_->client_id(), NumaTopology::Get().num_nodes() == 1),
      writer_(client_, cache_id, NumaTopology::Get().num_nodes(), &segments_, &tables_,
              &stats_) {}

CacheImpl::~CacheImpl() { Close(); }

Status CacheImpl::Attach(const std::shared_ptr<ClientImpl>& client, uint32_t cache_id,
                         uint32_t session_id, std::shared_ptr<CacheImpl>* out) {
  std::string path = client->paths().CacheFile(cache_id);
  ShmFile file;
  Status s = ShmFile::Open(path, &file);
  if (!s.ok()) return s;
  if (const char* bad = layout::CheckFileHeader(
          file.data(), file.size(), layout::kCacheMagic, sizeof(layout::CacheHeader))) {
    return Status::Corruption(path + ": " + bad);
  }
  const auto* header = reinterpret_cast<const layout::CacheHeader*>(file.data());
  if (header->cache_id != cache_id || header->session_id != session_id) {
    return Status::Corruption(path + ": belongs to another cache");
  }
  std::shared_ptr<CacheImpl> c(
      new CacheImpl(client, cache_id, session_id, std::move(file)));
  s = c->tables_.MapNew();
  if (!s.ok()) return s;
  *out = std::move(c);
  return Status::OK();
}

std::string CacheImpl::Label() const {
  // The header's name as the server wrote it; its length checked against
  // the array, as it is shared memory.
  const size_t len = std::min<size_t>(header_->name_len, sizeof header_->name);
  return fmt::format("cache {} (session {}, '{}')", cache_id_, session_id_,
                     std::string_view(header_->name, len));
}

Status CacheImpl::Usable() const {
  if (usable()) [[likely]] {
    return Status::OK();
  }
  if (closed_.load(std::memory_order_relaxed)) {
    return Status::InvalidArgument("cache is closed");
  }
  // A stopping server destroys every cache as it goes (Store::Shutdown): the
  // header cannot tell `shmcache -d` from `shmcache --stop`, so say both.
  return Status::NotFound(fmt::format(
      "session {} was destroyed (shmcache -d), or its server stopped (shmcache --stop)",
      session_id_));
}

Status CacheImpl::GetStats(CacheStats* out) {
  Status s = Usable();
  if (!s.ok()) return s;
  *out = ReadCacheStats(*header_, stats_.single_node());
  return Status::OK();
}

bool CacheImpl::IsFull() const {
  return layout::IsFull(header_->state.load(std::memory_order_relaxed));
}

void CacheImpl::Close() {
  if (closed_.exchange(true)) return;
  stats_.Release();
  writer_.ReturnChunks();
  reader_use_.Drop();
}

}  // namespace shmcache
