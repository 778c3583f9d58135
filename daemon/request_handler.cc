#include "request_handler.h"

#include <algorithm>

#include "layout.h"
#include "row_codec.h"

namespace shmcache {

using protocol::MsgType;
using protocol::WireReader;
using protocol::WireWriter;

std::string RequestHandler::Handle(uint64_t conn, MsgType type,
                                   std::span<const std::byte> body,
                                   bool* stop) {
  WireReader r(body);
  // The response is built in place behind an OK status (code 0, empty
  // message: five zero bytes), so a large payload is never copied again.
  WireWriter payload;
  payload.U8(0);
  payload.U32(0);
  Status s;
  auto malformed = [] {
    return Status::Corruption("malformed request body");
  };
  switch (type) {
    case MsgType::kHello: {
      r.U32();  // client pid, for the log
      if (!r.Done()) { s = malformed(); break; }
      payload.U32(store_->NewClientId());
      payload.Str(store_->paths().shm_prefix);
      break;
    }
    case MsgType::kCreateSession: {
      if (!r.Done()) { s = malformed(); break; }
      uint32_t id = 0;
      s = store_->CreateSession(&id);
      payload.U32(id);
      break;
    }
    case MsgType::kDestroySession:
    case MsgType::kCheckSession: {
      uint32_t id = r.U32();
      if (!r.Done()) { s = malformed(); break; }
      s = type == MsgType::kDestroySession ? store_->DestroySession(id)
                                           : store_->CheckSession(id);
      break;
    }
    case MsgType::kOpenCache: {
      uint32_t session = r.U32();
      std::string name = r.Str(layout::kMaxNameBytes);
      std::string fingerprint = r.Str(layout::kMaxNameBytes);
      uint64_t size_mb = r.U64();
      uint8_t spilling = r.U8();
      if (!r.Done() || spilling > 1) { s = malformed(); break; }
      uint32_t id = 0;
      s = store_->OpenCache(session, name, fingerprint, size_mb, spilling != 0, &id);
      payload.U32(id);
      break;
    }
    case MsgType::kLeaseChunk: {
      uint32_t cache_id = r.U32();
      uint32_t node = r.U32();
      uint64_t need = r.U64();
      uint8_t has_old = r.U8();
      uint32_t old_seg = r.U32();
      uint64_t old_off = r.U64();
      if (!r.Done() || need == 0 || need > protocol::kMaxLeaseBytes || node > 1024) {
        s = malformed();
        break;
      }
      ChunkLease lease;
      s = store_->LeaseChunk(conn, cache_id, static_cast<int>(node), need, &lease);
      if (s.ok() && has_old) {
        store_->ReturnChunk(conn, cache_id, old_seg, old_off).PermitUncheckedError();
      }
      payload.U32(lease.seg_no);
      payload.U64(lease.offset);
      payload.U64(lease.size);
      break;
    }
    case MsgType::kReturnChunk: {
      uint32_t cache_id = r.U32();
      uint32_t seg = r.U32();
      uint64_t off = r.U64();
      if (!r.Done()) { s = malformed(); break; }
      s = store_->ReturnChunk(conn, cache_id, seg, off);
      break;
    }
    case MsgType::kGrowIndex: {
      uint32_t cache_id = r.U32();
      uint32_t seen = r.U32();
      if (!r.Done()) { s = malformed(); break; }
      s = store_->GrowIndex(cache_id, seen);
      break;
    }
    case MsgType::kListSessions: {
      if (!r.Done()) { s = malformed(); break; }
      std::vector<SessionInfo> sessions;
      store_->ListSessions(&sessions);
      protocol::WriteSessions(payload, sessions);
      break;
    }
    case MsgType::kServerInfo: {
      if (!r.Done()) { s = malformed(); break; }
      ServerInfo info;
      store_->FillServerInfo(&info);
      protocol::WriteServerInfo(payload, info);
      break;
    }
    case MsgType::kSpillPut: {
      uint32_t cache_id = r.U32();
      uint64_t row_id = r.U64();
      std::span<const std::byte> row = r.Bytes();
      if (!r.Done()) { s = malformed(); break; }
      if (row.size() > protocol::kMaxSpilledRowBytes) {
        s = protocol::SpilledRowTooLarge(row_id, row.size());
        break;
      }
      // A row from a client is untrusted: it must decode, and carry its id.
      RowView view;
      s = RowCodec::Decode(row.data(), row.size(), &view);
      if (s.ok() && (view.encoded().size() != row.size() ||
                     RowCodec::KeyOf(view) != row_id)) {
        s = Status::Corruption("spilled row does not match its id or size");
      }
      if (!s.ok()) break;
      bool inserted = false;
      s = store_->SpillPut(cache_id, row_id, row, &inserted);
      payload.U8(inserted ? 1 : 0);
      break;
    }
    case MsgType::kSpillGet: {
      uint32_t cache_id = r.U32();
      uint32_t n = r.U32();
      if (!r.ok() || n == 0 || n > protocol::kMaxSpillBatch) { s = malformed(); break; }
      std::vector<uint64_t> ids(n);
      for (uint64_t& id : ids) id = r.U64();
      if (!r.Done()) { s = malformed(); break; }
      s = AnswerSpillGet(cache_id, ids, &payload);
      break;
    }
    case MsgType::kStop: {
      if (!r.Done()) { s = malformed(); break; }
      *stop = true;
      break;
    }
    default:
      s = Status::NotSupported("request type not supported by this server");
      break;
  }
  if (s.ok()) return std::move(payload.body());
  WireWriter out;
  protocol::WriteStatus(out, s);
  return std::move(out.body());
}

Status RequestHandler::AnswerSpillGet(uint32_t cache_id,
                                      std::span<const uint64_t> ids,
                                      WireWriter* payload) {
  const size_t n = ids.size();
  payload->U32(static_cast<uint32_t>(n));
  // Every id gets its one-byte mark; the rest is for rows.
  size_t budget = protocol::kMaxBodyBytes - payload->body().size() - n;
  std::vector<std::string> rows;
  std::vector<bool> found;
  size_t done = 0, found_rows = 0, found_bytes = 0, window = 1;
  while (done < n) {
    Status s = store_->SpillGet(cache_id, ids.subspan(done, window), &rows, &found);
    if (!s.ok()) return s;
    size_t window_bytes = 0;
    for (size_t k = 0; k < window; ++k) window_bytes += 4 + rows[k].size();
    payload->body().reserve(payload->body().size() + std::min(window_bytes, budget) + n);
    for (size_t k = 0; k < window; ++k) {
      size_t need = 4 + rows[k].size();  // length + bytes
      if (!found[k] || (need > budget && done + k == 0)) {
        // The second case is a stored row larger than any put accepts:
        // unanswerable, so a miss rather than a frame nobody can read.
        payload->U8(protocol::kSpillAbsent);
        continue;
      }
      if (need > budget) {  // the response is full: the client asks again
        for (size_t i = done + k; i < n; ++i) payload->U8(protocol::kSpillAskAgain);
        return Status::OK();
      }
      budget -= need;
      ++found_rows;
      found_bytes += rows[k].size();
      payload->U8(protocol::kSpillFound);
      payload->Str(rows[k]);
    }
    done += window;
    if (done == n) break;
    size_t avg = found_rows ? found_bytes / found_rows + 5 : 5;
    window = std::clamp<size_t>(budget / avg, 1, n - done);
  }
  return Status::OK();
}

}  // namespace shmcache
