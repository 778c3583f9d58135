// RequestHandler: turns one decoded request frame into its response body.
// Kept apart from the socket code so that tests and fuzzers can drive it
// with arbitrary bytes.
//
// Thread safety: Handle() may run on any worker thread; the Store locks.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "protocol.h"
#include "store.h"

namespace shmcache {

class RequestHandler {
 public:
  explicit RequestHandler(Store* store) : store_(store) {}

  // `type` is a validated request type (DecodeFrameHeader). Returns the
  // response body; sets *stop when the server should exit after sending it.
  std::string Handle(uint64_t conn, protocol::MsgType type,
                     std::span<const std::byte> body, bool* stop);

 private:
  // Appends the answer to a kSpillGet of `ids` to *payload: the count, then
  // per id a kSpill* mark (and the row). Rows are read in windows sized by
  // what the response still holds, so that a batch of large rows is not
  // read whole to answer a part; the first found row always fits
  // (kMaxSpilledRowBytes), so every answer makes progress.
  Status AnswerSpillGet(uint32_t cache_id, std::span<const uint64_t> ids,
                        protocol::WireWriter* payload);

  Store* store_;
};

}  // namespace shmcache
