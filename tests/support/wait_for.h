// Bounded waits: tests wait on a condition, never for a fixed time.
#pragma once

#include <chrono>
#include <functional>

namespace shmcache::test {

// Polls `cond` about every millisecond until it holds or `bound` passes;
// returns whether it held (checked once more at the bound).
bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds bound = std::chrono::seconds(20));

// In a forked child: runs `call` in a thread of its own and waits for it
// as WaitFor does. When it does not return (it waits for good: a lock a
// thrown step kept), the child _exits with `stuck_code` at once, since
// joining the thread, or a destructor that waits as it does, would hang.
void ReturnsOrExit(const std::function<void()>& call, int stuck_code);

}  // namespace shmcache::test
