// Bounded waits: tests wait on a condition, never for a fixed time.
#pragma once

#include <chrono>
#include <functional>

namespace shmcache::test {

// Polls `cond` about every millisecond until it holds or `bound` passes;
// returns whether it held (checked once more at the bound).
bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds bound = std::chrono::seconds(20));

}  // namespace shmcache::test
