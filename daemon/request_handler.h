// RequestHandler: turns one decoded request frame into its response body.
// Kept apart from the socket code so that tests and fuzzers can drive it
// with arbitrary bytes.
//
// Each request type has its message structs (protocol_messages.h) and one
// On() below; Handle decodes the body, runs the On() of its type through a
// table and encodes the answer. A body that does not decode is answered
// with Corruption and changes nothing.
//
// Thread safety: Handle() may run on any worker thread; the Store locks.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "daemon/store.h"
#include "format/protocol_messages.h"

namespace shmcache {

class RequestHandler {
 public:
  explicit RequestHandler(Store* store) : store_(store) {}

  // `type` is a validated request type (DecodeFrameHeader). Returns the
  // response body; sets *stop when the server should exit after sending it.
  std::string Handle(uint64_t conn, protocol::MsgType type,
                     std::span<const std::byte> body, bool* stop);

 private:
  // What an On() may use and set beside its message.
  struct Context {
    uint64_t conn = 0;
    bool stop = false;
    // Rows a SpillGetResponse's views point into.
    std::vector<std::string> rows;
  };
  using ServeFn = std::string (RequestHandler::*)(uint64_t conn,
                                                  std::span<const std::byte> body,
                                                  bool* stop);
  // Decodes a body of Request, runs its On() and encodes the answer.
  template <typename Request>
  std::string Serve(uint64_t conn, std::span<const std::byte> body, bool* stop);
  // Serve<R> for every request R, indexed by its type.
  template <typename... R>
  static constexpr std::array<ServeFn, protocol::kMaxMsgType + 1> ServeTable(
      protocol::TypeList<R...>);

  // One per request type: OK with *out filled, or the status that answers.
  Status On(Context* ctx, const protocol::HelloRequest& in, protocol::HelloResponse* out);
  Status On(Context* ctx, const protocol::CreateSessionRequest& in,
            protocol::CreateSessionResponse* out);
  Status On(Context* ctx, const protocol::DestroySessionRequest& in,
            protocol::NoPayload* out);
  Status On(Context* ctx, const protocol::CheckSessionRequest& in,
            protocol::NoPayload* out);
  Status On(Context* ctx, const protocol::OpenCacheRequest& in,
            protocol::OpenCacheResponse* out);
  Status On(Context* ctx, const protocol::LeaseChunkRequest& in,
            protocol::LeaseChunkResponse* out);
  Status On(Context* ctx, const protocol::ReturnChunkRequest& in,
            protocol::NoPayload* out);
  Status On(Context* ctx, const protocol::GrowIndexRequest& in, protocol::NoPayload* out);
  Status On(Context* ctx, const protocol::ListSessionsRequest& in,
            protocol::ListSessionsResponse* out);
  Status On(Context* ctx, const protocol::ServerInfoRequest& in,
            protocol::ServerInfoResponse* out);
  Status On(Context* ctx, const protocol::StopRequest& in, protocol::NoPayload* out);
  Status On(Context* ctx, const protocol::SpillPutRequest& in,
            protocol::SpillPutResponse* out);
  // Rows are read in windows sized by what the response still holds, so
  // that a batch of large rows is not read whole to answer a part; the
  // first found row always fits (kMaxSpilledRowBytes), so every answer
  // makes progress, and a row that does not fit beside others is answered
  // kSpillAskAgain, and alone in the next response. A row whose own read
  // fails is answered kSpillFailed with the error, in no more room than a
  // status message; the others are answered still.
  Status On(Context* ctx, const protocol::SpillGetRequest& in,
            protocol::SpillGetResponse* out);
  Status On(Context* ctx, const protocol::SpillStageRequest& in,
            protocol::SpillStageResponse* out);
  Status On(Context* ctx, const protocol::SpillPutStagedRequest& in,
            protocol::SpillPutStagedResponse* out);

  Store* store_;
};

}  // namespace shmcache
