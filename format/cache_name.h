// The rule for cache names and fingerprints, shared by the library (which
// refuses a bad name before asking) and the daemon (which refuses a client
// that skipped the library). Names are shown by --list_sessions (text and
// JSON) and come back as Python str, so they must be valid UTF-8.
#pragma once

#include <string_view>

#include "shmcache/status.h"

namespace shmcache {

// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF): what a strict decoder such as Python's accepts.
bool IsValidUtf8(std::string_view s);

// OK, or InvalidArgument naming what is wrong: `name` must have 1..255
// bytes, `fingerprint` at most 255, and both must be valid UTF-8.
Status CheckCacheName(std::string_view name, std::string_view fingerprint);

}  // namespace shmcache
