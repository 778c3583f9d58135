// Rows on disk: puts and gets of spilled rows are requests to the daemon,
// which holds the RocksDB spill store.

#include <algorithm>
#include <cstring>
#include <vector>

#include "cache_impl.h"
#include "row_codec.h"

namespace shmcache {

using protocol::MsgType;
using protocol::WireReader;
using protocol::WireWriter;

void CacheImpl::FetchSpilled(std::span<const uint64_t> ids, Row* const* rows,
                             Status* statuses) {
  size_t done = 0;
  while (done < ids.size()) {
    size_t n = std::min<size_t>(ids.size() - done, protocol::kMaxSpillBatch);
    WireWriter w;
    w.U32(cache_id_);
    w.U32(static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) w.U64(ids[done + i]);
    std::string body;
    WireReader r({});
    Status s = client_->Call(MsgType::kSpillGet, w, &body, &r);
    uint32_t count = s.ok() ? r.U32() : 0;
    if (s.ok() && count != n) s = Status::Corruption("malformed spill response");
    if (!s.ok()) {
      for (size_t i = done; i < ids.size(); ++i) statuses[i] = s;
      return;
    }
    size_t answered = 0;
    for (size_t i = 0; i < n; ++i) {
      size_t k = done + i;
      uint8_t mark = r.U8();
      if (mark == protocol::kSpillAskAgain) break;
      ++answered;
      if (mark != protocol::kSpillFound) {
        statuses[k] = Miss(ids[k]);
        continue;
      }
      std::span<const std::byte> bytes = r.Bytes();
      if (!r.ok()) {
        statuses[k] = Status::Corruption("malformed spill response");
        continue;
      }
      std::memcpy(RowCodec::Reserve(rows[k], bytes.size()), bytes.data(), bytes.size());
      statuses[k] = RowCodec::Adopt(rows[k], bytes.size());
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
  WireWriter w;
  w.U32(cache_id_);
  w.U64(id);
  w.Bytes(std::span<const std::byte>(bytes, size));
  std::string body;
  WireReader r({});
  Status s = client_->Call(MsgType::kSpillPut, w, &body, &r);
  if (!s.ok()) return s;
  bool added = r.U8() != 0;
  if (inserted) *inserted = added;
  return Status::OK();
}

}  // namespace shmcache
