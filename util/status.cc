#include "shmcache/status.h"

#include <cerrno>
#include <cstring>

namespace shmcache {

const char* CodeName(Status::Code code) {
  switch (code) {
    case Status::Code::kOk: return "OK";
    case Status::Code::kNotFound: return "Not found";
    case Status::Code::kInvalidArgument: return "Invalid argument";
    case Status::Code::kAlreadyExists: return "Already exists";
    case Status::Code::kFull: return "Cache full";
    case Status::Code::kUnavailable: return "Unavailable";
    case Status::Code::kCorruption: return "Corruption";
    case Status::Code::kPermissionDenied: return "Permission denied";
    case Status::Code::kIOError: return "IO error";
    case Status::Code::kNotSupported: return "Not supported";
    case Status::Code::kFingerprintMismatch: return "Fingerprint mismatch";
    case Status::Code::kTooLarge: return "Row too large";
  }
  return "Unknown";
}

Status Status::FromErrno(std::string_view what, int err) {
  std::string m(what);
  m += ": ";
  m += std::strerror(err);
  if (err == EACCES || err == EPERM) return PermissionDenied(m);
  return IOError(m);
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return msg_ ? *msg_ : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s = CodeName(code_);
  s += ": ";
  s += message();
  return s;
}

}  // namespace shmcache
