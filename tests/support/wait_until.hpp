#pragma once
// The one way the tests wait for something another thread or process does: poll a predicate until
// it holds or a deadline passes. Never a fixed sleep that hopes the other side was fast enough.

#include <chrono>
#include <functional>
#include <thread>

namespace ddprun::test {

// Calls `pred` until it returns true (-> true) or `timeout` has passed (-> false, after one last
// call). Between calls it sleeps `interval` (0: yields, for state in this process).
inline bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
                       std::chrono::milliseconds interval = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    if (interval.count() > 0) {
      std::this_thread::sleep_for(interval);  // sleep override: the polling interval
    } else {
      std::this_thread::yield();
    }
  }
  return pred();
}

}  // namespace ddprun::test
