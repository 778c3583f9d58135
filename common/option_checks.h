// Option checks: how the values people give a server (to `shmcache` or to
// shmcached itself) are read and checked, once for both binaries. Every
// refusal is InvalidArgument with one line that names the value, what was
// wrong and the valid range. Numbers are read by parse_number.h (decimal
// only: "010" is ten), as typed: digits alone, without white space or a
// '+' (TypedNumberFlaw names which, in the refusal). The port and host checks are the
// instance naming (ParsePort, CheckHost in format/instance.h), which every client uses
// too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "format/layout.h"
#include "shmcache/status.h"

namespace shmcache {

// The share of physical memory all caches may use when no cap is given.
inline constexpr double kDefaultMemoryCapRatio = 0.8;

// A decimal in [lo, hi] into *out, or "<what> '<text>' is not a number in
// <lo>..<hi>" (e.g. what = "worker count").
Status ParseInRange(std::string_view what, std::string_view text, long lo, long hi,
                    long* out);

// -d: 1..4294967295 ("session id '<text>' is not a number in 1..4294967295"
// and where to find one: the commands it names carry " -p <port>" when
// `port` is not the default, PortArg); 0 is refused as no session, which
// it is.
Status ParseSessionId(std::string_view text, int port, uint32_t* id);
// -w: 1..512.
Status ParseWorkers(std::string_view text, int* workers);
// -l: 0 debug .. 4 fatal.
Status ParseLogLevel(std::string_view text, int* level);
// -r: a share of physical memory in (0, 1].
Status ParseMemoryCapRatio(std::string_view text, double* ratio);
// --memory_cap_mb: a positive number of MB; *bytes is it in bytes.
Status ParseMemoryCapMb(std::string_view text, uint64_t* bytes);
// --metrics_interval: seconds in 1..3600.
Status ParseMetricsInterval(std::string_view text, int* seconds);
// "<what> '<path>' is not an absolute path" unless it starts with '/'; a
// path that ends in white space is refused too (a quoting slip).
Status CheckAbsolutePath(std::string_view what, std::string_view path);

// Checks a spill dir: absolute, an existing directory, writable.
Status CheckSpillDir(const std::string& dir);
// The bytes the server's temporary metrics file adds to the file's name
// (".tmp." and eight hex digits: daemon/replace_file.cc).
inline constexpr size_t kMetricsTempSuffixBytes = 13;
// Checks that `path` can be the metrics file (daemon/metrics_file.h):
// absolute, not a directory, in an existing directory this user may write,
// a name whose temporary file's name fits in NAME_MAX, and not another
// user's file in a sticky directory (which this user could not replace).
Status CheckMetricsFile(const std::string& path);

// The cap of all caches together as asked: cap_bytes when not 0, else
// `ratio` of physical memory. The server's cap is the smallest of this and
// the other bounds (ComputeMemoryBounds, memory_bounds.h, starts from it).
uint64_t MemoryCapBytes(double ratio, uint64_t cap_bytes);
// InvalidArgument, naming the option and its minimum, when that cap is
// below one segment (layout::kMinSegmentBytes): no cache could hold a row.
Status CheckMemoryCap(double ratio, uint64_t cap_bytes);

// The worker threads a server runs: `requested`, or half of `cpus` (at
// least one) when 0, rounded up to a multiple of `nodes` so that every
// NUMA node gets as many.
int WorkerCount(int requested, int cpus, int nodes);

}  // namespace shmcache
