// How a message says a size in bytes.
#pragma once

#include <cstdint>
#include <string>

namespace shmcache {

// MB to a tenth from 1 MB up, KB (rounded) below, bytes below that: a few
// KB never read as "0.0 MB", as if nothing were there.
std::string SizeText(uint64_t n);

}  // namespace shmcache
