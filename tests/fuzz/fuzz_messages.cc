// Fuzz target: the Decode of every control message, requests and responses
// alike, without a daemon. The first input byte picks the message (see
// Pick), the rest is its body. A body Decode accepts must encode again: a
// request exactly into the bytes read (what the daemon accepts is what a
// client writes), a response into a body that decodes again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "format/protocol_messages.h"

using namespace shmcache;
using namespace shmcache::protocol;

namespace {

template <typename M>
void Check(std::span<const std::byte> body, bool exact) {
  M decoded;
  if (!DecodeBody(body, &decoded)) return;
  const std::string again = EncodeBody(decoded);
  if (exact && (again.size() != body.size() ||
                std::memcmp(again.data(), body.data(), body.size()) != 0)) {
    std::abort();
  }
  M twice;
  if (!DecodeBody(std::as_bytes(std::span(again)), &twice)) std::abort();
}

// Message `pick`: request k for pick 2k, its response for 2k + 1.
template <typename... R>
void Pick(size_t pick, std::span<const std::byte> body, TypeList<R...>) {
  size_t k = 0;
  auto check = [&]<typename Request>() {
    if (pick / 2 != k++) return false;
    if (pick % 2 == 0) {
      Check<Request>(body, true);
    } else {
      Check<typename Request::Response>(body, false);
    }
    return true;
  };
  (void)(check.template operator()<R>() || ...);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  Pick(data[0] % (2 * kMaxMsgType), in.subspan(1), Requests{});
  return 0;
}
