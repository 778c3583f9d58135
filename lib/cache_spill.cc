// Rows on disk: puts and gets of spilled rows are requests to the daemon,
// which holds the RocksDB spill store.

#include <algorithm>
#include <cstring>
#include <vector>

#include "cache_impl.h"
#include "row_codec.h"

namespace shmcache {

void CacheImpl::FetchSpilled(std::span<const uint64_t> ids, Row* const* rows,
                             Status* statuses) {
  size_t done = 0;
  while (done < ids.size()) {
    size_t n = std::min<size_t>(ids.size() - done, protocol::kMaxSpillBatch);
    protocol::SpillGetRequest request{.cache_id = cache_id_};
    request.ids.assign(ids.begin() + static_cast<long>(done),
                       ids.begin() + static_cast<long>(done + n));
    protocol::SpillGetResponse answer;
    std::string body;
    Status s = client_->Call(request, &answer, &body);
    if (s.ok() && answer.answers.size() != n) {
      s = Status::Corruption("malformed spill response");
    }
    if (!s.ok()) {
      for (size_t i = done; i < ids.size(); ++i) statuses[i] = s;
      return;
    }
    size_t answered = 0;
    for (const protocol::SpillGetResponse::Answer& a : answer.answers) {
      if (a.mark == protocol::kSpillAskAgain) break;
      const size_t k = done + answered++;
      if (a.mark != protocol::kSpillFound) {
        statuses[k] = Miss(ids[k]);
        continue;
      }
      std::memcpy(RowCodec::Reserve(rows[k], a.row.size()), a.row.data(), a.row.size());
      statuses[k] = RowCodec::Adopt(rows[k], a.row.size());
      if (statuses[k].ok() && RowCodec::KeyOf(rows[k]->view()) != ids[k]) {
        statuses[k] = Status::Corruption("spilled row carries another id");
      }
    }
    if (answered == 0) {  // the daemon answers a first row always; never spin
      for (size_t i = done; i < ids.size(); ++i) {
        statuses[i] = Status::Corruption("the cache server answered none of the "
                                         "spilled rows asked for");
      }
      return;
    }
    done += answered;
  }
}

bool CacheImpl::SpillingOn() const {
  return layout::SpillingOn(header_->state.load(std::memory_order_relaxed));
}

bool CacheImpl::SpillsNow() const {
  return layout::SpillsNow(header_->state.load(std::memory_order_relaxed));
}

Status CacheImpl::SpillPut(uint64_t id, std::span<const ColumnRef> columns,
                           size_t size, bool* inserted) {
  // Checked before anything is sent: a frame over the limit would make the
  // daemon drop the connection.
  if (size > protocol::kMaxSpilledRowBytes) {
    return protocol::SpilledRowTooLarge(id, size);
  }
  static thread_local std::vector<uint64_t> buf;
  buf.resize((size + 7) / 8);
  auto* bytes = reinterpret_cast<std::byte*>(buf.data());
  RowCodec::Encode(id, columns, bytes, size);
  protocol::SpillPutResponse answer;
  Status s = client_->Call(
      protocol::SpillPutRequest{.cache_id = cache_id_,
                                .row_id = id,
                                .row = std::span<const std::byte>(bytes, size)},
      &answer);
  if (!s.ok()) return s;
  if (inserted) *inserted = answer.inserted;
  return Status::OK();
}

}  // namespace shmcache
