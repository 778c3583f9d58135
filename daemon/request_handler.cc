#include "daemon/request_handler.h"

#include <algorithm>

#include "format/row_codec.h"

namespace shmcache {

namespace pr = protocol;

template <typename... R>
constexpr std::array<RequestHandler::ServeFn, pr::kMaxMsgType + 1>
RequestHandler::ServeTable(pr::TypeList<R...>) {
  std::array<ServeFn, pr::kMaxMsgType + 1> table{};
  ((table[static_cast<size_t>(R::kType)] = &RequestHandler::Serve<R>), ...);
  return table;
}

std::string RequestHandler::Handle(uint64_t conn, pr::MsgType type,
                                   std::span<const std::byte> body, bool* stop) {
  static constexpr auto kServe = ServeTable(pr::Requests{});
  const auto t = static_cast<size_t>(type);
  if (t >= kServe.size() || kServe[t] == nullptr) {
    return pr::EncodeStatus(
        Status::NotSupported("request type not supported by this server"));
  }
  return (this->*kServe[t])(conn, body, stop);
}

template <typename Request>
std::string RequestHandler::Serve(uint64_t conn, std::span<const std::byte> body,
                                  bool* stop) {
  Request in;
  if (!pr::DecodeBody(body, &in)) {
    return pr::EncodeStatus(Status::Corruption("malformed request body"));
  }
  Context ctx{.conn = conn};
  typename Request::Response out;
  Status s = On(&ctx, in, &out);
  if (!s.ok()) return pr::EncodeStatus(s);
  if (ctx.stop) *stop = true;
  pr::WireWriter w;
  pr::WriteStatus(w, s);
  pr::EncodeMessage(out, &w);
  return std::move(w.body());
}

Status RequestHandler::On(Context*, const pr::HelloRequest&, pr::HelloResponse* out) {
  out->client_id = store_->NewClientId();
  out->shm_prefix = store_->paths().shm_prefix;
  return Status::OK();
}

Status RequestHandler::On(Context*, const pr::CreateSessionRequest&,
                          pr::CreateSessionResponse* out) {
  return store_->CreateSession(&out->session_id);
}

Status RequestHandler::On(Context*, const pr::DestroySessionRequest& in, pr::NoPayload*) {
  return store_->DestroySession(in.session_id);
}

Status RequestHandler::On(Context*, const pr::CheckSessionRequest& in, pr::NoPayload*) {
  return store_->CheckSession(in.session_id);
}

Status RequestHandler::On(Context*, const pr::OpenCacheRequest& in,
                          pr::OpenCacheResponse* out) {
  return store_->OpenCache(in.session_id, in.name, in.fingerprint, in.size_mb,
                           in.spill_requested, &out->cache_id);
}

Status RequestHandler::On(Context* ctx, const pr::LeaseChunkRequest& in,
                          pr::LeaseChunkResponse* out) {
  ChunkLease lease;
  Status s = store_->LeaseChunk(ctx->conn, in.cache_id, static_cast<int>(in.node),
                                in.need, &lease);
  if (!s.ok()) return s;
  if (in.has_old) {
    store_->ReturnChunk(ctx->conn, in.cache_id, in.old_seg_no, in.old_offset)
        .PermitUncheckedError();
  }
  *out = {.seg_no = lease.seg_no, .offset = lease.offset, .size = lease.size};
  return Status::OK();
}

Status RequestHandler::On(Context* ctx, const pr::ReturnChunkRequest& in,
                          pr::NoPayload*) {
  return store_->ReturnChunk(ctx->conn, in.cache_id, in.seg_no, in.offset);
}

Status RequestHandler::On(Context*, const pr::GrowIndexRequest& in, pr::NoPayload*) {
  return store_->GrowIndex(in.cache_id, in.seen_tables);
}

Status RequestHandler::On(Context*, const pr::ListSessionsRequest&,
                          pr::ListSessionsResponse* out) {
  store_->ListSessions(&out->sessions);
  return Status::OK();
}

Status RequestHandler::On(Context*, const pr::ServerInfoRequest&,
                          pr::ServerInfoResponse* out) {
  store_->FillServerInfo(&out->info);
  return Status::OK();
}

Status RequestHandler::On(Context* ctx, const pr::StopRequest&, pr::NoPayload*) {
  ctx->stop = true;
  return Status::OK();
}

Status RequestHandler::On(Context*, const pr::SpillPutRequest& in,
                          pr::SpillPutResponse* out) {
  if (in.row.size() > pr::kMaxSpilledRowBytes) {
    return pr::SpilledRowTooLarge(in.row_id, in.row.size());
  }
  // A row from a client is untrusted: it must decode, and carry its id.
  if (!RowCodec::IsRowOf(in.row.data(), in.row.size(), in.row_id)) {
    return Status::Corruption("spilled row does not match its id or size");
  }
  return store_->SpillPut(in.cache_id, in.row_id, in.row, &out->inserted);
}

Status RequestHandler::On(Context* ctx, const pr::SpillStageRequest& in,
                          pr::SpillStageResponse* out) {
  return store_->SpillStage(ctx->conn, in.cache_id, in.min_bytes, &out->tag, &out->size);
}

Status RequestHandler::On(Context* ctx, const pr::SpillPutStagedRequest& in,
                          pr::SpillPutStagedResponse* out) {
  return store_->SpillPutStaged(ctx->conn, in.cache_id, in.tag, in.ids, in.sizes,
                                &out->inserted);
}

Status RequestHandler::On(Context* ctx, const pr::SpillGetRequest& in,
                          pr::SpillGetResponse* out) {
  const std::span<const uint64_t> ids = in.ids;
  const size_t n = ids.size();
  out->answers.assign(n, {});  // kSpillAbsent
  // The rows' room: the frame less an OK status (code and empty message),
  // the count and one mark per id.
  size_t budget = pr::kMaxBodyBytes - 5 - 4 - n;
  ctx->rows.reserve(n);  // never reallocated: the answers point into it
  std::vector<std::string> rows;
  std::vector<Status> read;
  size_t done = 0, found_rows = 0, found_bytes = 0, window = 1;
  while (done < n) {
    Status s = store_->SpillGet(in.cache_id, ids.subspan(done, window), &rows, &read);
    if (!s.ok()) return s;
    for (size_t k = 0; k < window; ++k) {
      uint8_t mark = pr::kSpillFound;
      if (!read[k].ok() && !read[k].IsNotFound()) {
        mark = pr::kSpillFailed;
        rows[k] = read[k].message().substr(0, pr::kMaxStringBytes);
      }
      const size_t need = pr::SpillGetResponse::FoundRowBytes(rows[k].size());
      // The second case is a stored row larger than any put accepts:
      // unanswerable, so a miss rather than a frame nobody can read.
      if (read[k].IsNotFound() || (need > budget && done + k == 0)) continue;
      if (need > budget) {  // the response is full: the client asks again
        for (size_t i = done + k; i < n; ++i) out->answers[i].mark = pr::kSpillAskAgain;
        return Status::OK();
      }
      budget -= need;
      if (mark == pr::kSpillFound) {
        ++found_rows;
        found_bytes += rows[k].size();
      }
      const std::string& row = ctx->rows.emplace_back(std::move(rows[k]));
      out->answers[done + k] = {mark, std::as_bytes(std::span(row))};
    }
    done += window;
    if (done == n) break;
    size_t avg = found_rows ? found_bytes / found_rows + 5 : 5;
    window = std::clamp<size_t>(budget / avg, 1, n - done);
  }
  return Status::OK();
}

}  // namespace shmcache
