// Status: the error type of every libshmcache call. No exception crosses the
// API; a call reports through a Status and returns results through
// out-parameters.
//
// Out-parameters after an error: a call that fails leaves its
// out-parameters as they were, except where its comment says otherwise
// (the reads empty their Row / RowView, see row.h; batches fill one status
// per element; Put sets *inserted on every return).
//
// Thread safety: a Status is a value; distinct objects may be used from
// distinct threads without synchronisation.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "shmcache/export.h"

namespace shmcache {

class SHMCACHE_EXPORT [[nodiscard]] Status {
 public:
  enum class Code : unsigned char {
    kOk = 0,
    kNotFound = 1,         // row, session, cache or column does not exist
    kInvalidArgument = 2,  // the caller passed something wrong
    kAlreadyExists = 3,    // e.g. a second daemon on the same instance
    kFull = 4,             // the cache's memory budget is used up
    kUnavailable = 5,      // the daemon is not reachable
    kCorruption = 6,       // shared memory or a frame failed validation
    kPermissionDenied = 7,
    kIOError = 8,  // a system call failed (errno in the message)
    kNotSupported = 9,
    kFingerprintMismatch = 10,  // cache name reused for another pipeline
    kTooLarge = 11,             // a row the cache has no room for; other rows fit
  };

  Status() = default;
  Status(Code code, std::string_view msg) : Status(code, SubCode::kNone, msg) {}
  Status(const Status& o)
      : code_(o.code_),
        subcode_(o.subcode_),
        msg_(o.msg_ ? new std::string(*o.msg_) : nullptr) {}
  Status& operator=(const Status& o) {
    if (this != &o) {
      code_ = o.code_;
      subcode_ = o.subcode_;
      msg_.reset(o.msg_ ? new std::string(*o.msg_) : nullptr);
    }
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status NotFound(std::string_view m) { return {Code::kNotFound, m}; }
  // The row exists but lacks a column the caller named. A NotFound (so a
  // caller that takes NotFound for a miss still does), told apart from a
  // missing row by IsColumnNotFound().
  static Status ColumnNotFound(std::string_view m) {
    return {Code::kNotFound, SubCode::kColumnNotFound, m};
  }
  // A spilled row failed its check when read back (a table block of the
  // spill database failing its checksum, bytes that are not the row): the
  // server dropped it from the cache, so it is a miss now and from now on,
  // until it is put again. A NotFound (a caller that takes NotFound for a
  // miss reads it from its source and puts it again, which replaces it),
  // told apart by IsRowDropped(); the message names the row and the error.
  static Status RowDropped(std::string_view m) {
    return {Code::kNotFound, SubCode::kRowDropped, m};
  }
  static Status InvalidArgument(std::string_view m) {
    return {Code::kInvalidArgument, m};
  }
  static Status AlreadyExists(std::string_view m) { return {Code::kAlreadyExists, m}; }
  static Status Full(std::string_view m) { return {Code::kFull, m}; }
  // Full because the shared-memory filesystem has no room left (not the
  // cache's budget): IsFull() and IsFullNoShmRoom().
  static Status FullNoShmRoom(std::string_view m) {
    return {Code::kFull, SubCode::kNoShmRoom, m};
  }
  // Full because the server's memory cap is used up (not the cache's
  // budget): IsFull() and IsFullServerCap().
  static Status FullServerCap(std::string_view m) {
    return {Code::kFull, SubCode::kServerCap, m};
  }
  static Status Unavailable(std::string_view m) { return {Code::kUnavailable, m}; }
  static Status Corruption(std::string_view m) { return {Code::kCorruption, m}; }
  static Status PermissionDenied(std::string_view m) {
    return {Code::kPermissionDenied, m};
  }
  static Status IOError(std::string_view m) { return {Code::kIOError, m}; }
  // An IOError whose message ends with strerror(err).
  static Status FromErrno(std::string_view what, int err);
  static Status NotSupported(std::string_view m) { return {Code::kNotSupported, m}; }
  static Status FingerprintMismatch(std::string_view m) {
    return {Code::kFingerprintMismatch, m};
  }
  static Status TooLarge(std::string_view m) { return {Code::kTooLarge, m}; }

  bool ok() const { return code_ == Code::kOk; }
  // Also true for ColumnNotFound and RowDropped.
  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsColumnNotFound() const {
    return code_ == Code::kNotFound && subcode_ == SubCode::kColumnNotFound;
  }
  bool IsRowDropped() const {
    return code_ == Code::kNotFound && subcode_ == SubCode::kRowDropped;
  }
  bool IsInvalidArgument() const { return code_ == Code::kInvalidArgument; }
  bool IsAlreadyExists() const { return code_ == Code::kAlreadyExists; }
  // Also true for FullNoShmRoom and FullServerCap; a Full that is neither
  // is the cache's own budget used up.
  bool IsFull() const { return code_ == Code::kFull; }
  bool IsFullNoShmRoom() const {
    return code_ == Code::kFull && subcode_ == SubCode::kNoShmRoom;
  }
  bool IsFullServerCap() const {
    return code_ == Code::kFull && subcode_ == SubCode::kServerCap;
  }
  bool IsUnavailable() const { return code_ == Code::kUnavailable; }
  bool IsCorruption() const { return code_ == Code::kCorruption; }
  bool IsPermissionDenied() const { return code_ == Code::kPermissionDenied; }
  bool IsIOError() const { return code_ == Code::kIOError; }
  bool IsNotSupported() const { return code_ == Code::kNotSupported; }
  bool IsFingerprintMismatch() const { return code_ == Code::kFingerprintMismatch; }
  bool IsTooLarge() const { return code_ == Code::kTooLarge; }

  Code code() const { return code_; }
  // Empty for OK.
  const std::string& message() const;
  // "OK" or "<code name>: <message>".
  std::string ToString() const;

  // Refines a code where callers must tell cases apart. Travels on the
  // wire with the code (protocol.h's WriteStatus).
  enum class SubCode : unsigned char {
    kNone = 0,
    kColumnNotFound = 1,  // of kNotFound
    kNoShmRoom = 2,       // of kFull
    kServerCap = 3,       // of kFull
    kRowDropped = 4,      // of kNotFound
    kLast = kRowDropped,
  };
  SubCode subcode() const { return subcode_; }
  Status(Code code, SubCode subcode, std::string_view msg)
      : code_(code),
        subcode_(subcode),
        msg_(code == Code::kOk ? nullptr : new std::string(msg)) {}

  // Spells out that a status is dropped on purpose.
  void PermitUncheckedError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.subcode_ == b.subcode_ && a.message() == b.message();
  }

 private:
  Code code_ = Code::kOk;
  SubCode subcode_ = SubCode::kNone;
  // Null for OK, so that the success path (every hit) costs one word.
  std::unique_ptr<std::string> msg_;
};

SHMCACHE_EXPORT const char* CodeName(Status::Code code);

}  // namespace shmcache
