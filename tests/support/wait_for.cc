#include "tests/support/wait_for.h"

#include <thread>

namespace shmcache::test {

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds bound) {
  auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    if (cond()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace shmcache::test
