// FieldWriter and FieldReader: the two ways a message's one description of
// its body (its static Fields(m, io), protocol_messages.h) is walked. Each
// field is named once, in order, with its wire type and its bounds:
//
//   template <typename M, typename IO>
//   static void Fields(M& m, IO& io) {
//     io.U32(m.cache_id);
//     io.Str(m.name, kMaxNameBytes);
//     io.Check(m.cache_id != 0);
//   }
//
// A FieldWriter appends the fields of a const message to a body; a
// FieldReader fills a message from a body, checking each field against what
// is left and its bound, and turns a failed Check into a malformed body. A
// body read whole with every check met is what the writer writes for the
// message read (fuzz_messages and protocol_messages_test check it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "format/protocol.h"

namespace shmcache::protocol {

class FieldWriter {
 public:
  static constexpr bool kReading = false;
  explicit FieldWriter(WireWriter* w) : w_(w) {}

  void U8(uint8_t v) { w_->U8(v); }
  void U32(uint32_t v) { w_->U32(v); }
  void U64(uint64_t v) { w_->U64(v); }
  // One byte, 0 or 1.
  void Flag(bool v) { w_->Flag(v); }
  // A flag as a u32, 0 or 1.
  void Flag32(bool v) { w_->U32(v ? 1 : 0); }
  // An int as a u32 (two's complement).
  void Int(int v) { w_->U32(static_cast<uint32_t>(v)); }
  // Seconds as whole milliseconds (u64), clamped to its range.
  void Millis(double seconds) { w_->U64(ToMillis(seconds)); }
  void Str(const std::string& s, size_t = kMaxStringBytes) { w_->Str(s); }
  void Bytes(std::span<const std::byte> b, size_t = kMaxBodyBytes) { w_->Bytes(b); }
  // A u32 count, then each element through `each`.
  template <typename T, typename Each>
  void List(const std::vector<T>& v, size_t /*max*/, Each each, size_t /*min*/ = 0) {
    w_->U32(static_cast<uint32_t>(v.size()));
    for (const T& e : v) each(e);
  }
  // A writer writes what it is given: the checks are the reader's.
  void Check(bool) {}
  // Room for `n` more bytes of body, ahead of a large message.
  void Reserve(size_t n) { w_->body().reserve(w_->body().size() + n); }

  static uint64_t ToMillis(double seconds) {
    const double ms = seconds * 1000;
    if (!(ms > 0)) return 0;
    if (ms >= 0x1p64) return std::numeric_limits<uint64_t>::max();
    return static_cast<uint64_t>(ms);
  }

 private:
  WireWriter* w_;
};

class FieldReader {
 public:
  static constexpr bool kReading = true;
  explicit FieldReader(WireReader* r) : r_(r) {}

  void U8(uint8_t& v) { v = r_->U8(); }
  void U32(uint32_t& v) { v = r_->U32(); }
  void U64(uint64_t& v) { v = r_->U64(); }
  void Flag(bool& v) { v = r_->Flag(); }
  void Flag32(bool& v) {
    const uint32_t u = r_->U32();
    Check(u <= 1);
    v = u == 1;
  }
  void Int(int& v) { v = static_cast<int>(r_->U32()); }
  void Millis(double& seconds) { seconds = static_cast<double>(r_->U64()) / 1000; }
  void Str(std::string& s, size_t max = kMaxStringBytes) { s = r_->Str(max); }
  // A view of the body: valid while the body is.
  void Bytes(std::span<const std::byte>& b, size_t max = kMaxBodyBytes) {
    b = r_->Bytes(max);
  }
  // A count of min..max, then as many elements as the body holds (one at a
  // time: a count a hostile body inflates allocates nothing ahead).
  template <typename T, typename Each>
  void List(std::vector<T>& v, size_t max, Each each, size_t min = 0) {
    const uint32_t n = r_->U32();
    Check(n >= min && n <= max);
    v.clear();
    for (uint32_t k = 0; k < n && r_->ok(); ++k) each(v.emplace_back());
  }
  // A field read lies outside its range: the body is malformed.
  void Check(bool ok) {
    if (!ok) r_->Fail();
  }
  void Reserve(size_t) {}

 private:
  WireReader* r_;
};

// The body of message `m`, appended to *w.
template <typename M>
void EncodeMessage(const M& m, WireWriter* w) {
  FieldWriter io(w);
  M::Fields(m, io);
}

// Reads one whole body as *out: true when every field was read within its
// bounds, every check met and no byte is left over. On false *out holds
// whatever was read and is not to be used.
template <typename M>
bool DecodeMessage(WireReader* r, M* out) {
  FieldReader io(r);
  M::Fields(*out, io);
  return r->Done();
}

}  // namespace shmcache::protocol
