// Fuzz target: the control protocol as the daemon sees it. The input is a
// byte stream of frames; each is decoded with DecodeFrameHeader and, when
// valid, its (possibly truncated) body goes to RequestHandler::Handle (the
// Decode of its request message) over a real Store on a private shm dir.
// Every answer must read as the client reads it: a status, and for OK the
// request's response message. The store is emptied after each input.
//
// Session ids are random and cache ids grow across inputs, so a fuzzer could
// never guess them: a request whose first u32 (a session or cache id) is
// below 4 gets the id of the session (or cache) created that many requests
// earlier in this input, when there is one.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "daemon/request_handler.h"
#include "format/protocol_messages.h"
#include "tests/fuzz/fuzz_common.h"

using namespace shmcache;
using protocol::MsgType;

namespace {

// Reads a response of request R; *id: the session or cache it created.
template <typename R>
bool ResponseReads(protocol::WireReader* r, uint32_t* id) {
  typename R::Response out;
  if (!protocol::DecodeMessage(r, &out)) return false;
  if constexpr (std::is_same_v<R, protocol::CreateSessionRequest>) *id = out.session_id;
  if constexpr (std::is_same_v<R, protocol::OpenCacheRequest>) *id = out.cache_id;
  return true;
}

template <typename... R>
bool ResponseReads(MsgType type, protocol::WireReader* r, uint32_t* id,
                   protocol::TypeList<R...>) {
  bool ok = false;
  (void)((type == R::kType && (ok = ResponseReads<R>(r, id), true)) || ...);
  return ok;
}

// Whether `resp`, the answer to a request of `type`, reads as the client
// reads it: an error alone, or OK and the request's response message.
bool AnswerReads(MsgType type, const std::string& resp, uint32_t* id) {
  protocol::WireReader r(
      std::span(reinterpret_cast<const std::byte*>(resp.data()), resp.size()));
  Status answer = protocol::ReadStatus(r);
  if (!r.ok()) return false;
  if (!answer.ok()) return r.Done();
  return ResponseReads(type, &r, id, protocol::Requests{});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& env = fuzz::Env();
  static std::unique_ptr<Store> store = [&] {
    auto s = env.NewStore();
    if (!s->Init().ok()) std::abort();
    return s;
  }();
  RequestHandler handler(store.get());
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  // Two connections interleave, as on a real server.
  uint64_t conn = 1;
  std::vector<uint32_t> sessions, caches;
  while (in.size() >= protocol::kFrameHeaderBytes) {
    protocol::FrameHeader h;
    Status s = protocol::DecodeFrameHeader(in.first(protocol::kFrameHeaderBytes), &h);
    in = in.subspan(protocol::kFrameHeaderBytes);
    if (!s.ok() || (h.type & protocol::kResponseBit)) break;  // server closes
    size_t n = std::min<size_t>(h.body_len, in.size());
    auto type = static_cast<protocol::MsgType>(h.type);
    std::vector<std::byte> body(in.begin(), in.begin() + static_cast<long>(n));
    bool by_session = type == MsgType::kDestroySession ||
                      type == MsgType::kCheckSession || type == MsgType::kOpenCache;
    bool by_cache = type == MsgType::kLeaseChunk || type == MsgType::kReturnChunk ||
                    type == MsgType::kGrowIndex;
    const std::vector<uint32_t>& ids = by_session ? sessions : caches;
    if ((by_session || by_cache) && body.size() >= 4) {
      uint32_t idx;
      std::memcpy(&idx, body.data(), 4);
      if (idx < 4 && idx < ids.size())
        std::memcpy(body.data(), &ids[ids.size() - 1 - idx], 4);
    }
    bool stop = false;
    std::string resp = handler.Handle(conn, type, body, &stop);
    uint32_t id = 0;
    if (!AnswerReads(type, resp, &id)) std::abort();
    if (id != 0) (type == MsgType::kCreateSession ? sessions : caches).push_back(id);
    in = in.subspan(n);
    conn = conn == 1 ? 2 : 1;
  }
  store->ReleaseConnection(1, nullptr);  // no process: the peer is gone
  store->ReleaseConnection(2, nullptr);
  store->Shutdown();
  return 0;
}
