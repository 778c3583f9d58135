#include "tests/support/wait_for.h"

#include <unistd.h>

#include <atomic>
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

void ReturnsOrExit(const std::function<void()>& call, int stuck_code) {
  std::atomic<bool> done{false};
  std::thread t([&] {
    call();
    done = true;
  });
  if (!WaitFor([&] { return done.load(); })) _exit(stuck_code);
  t.join();
}

}  // namespace shmcache::test
