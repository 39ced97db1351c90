#pragma once
// Test helper: the latest value a callback on another thread delivered (a watcher's round end, a
// watchdog's hang), read safely from the test's thread.

#include <functional>
#include <mutex>
#include <optional>

namespace ddprun::test {

template <typename T>
class Latest {
 public:
  // The callback to hand over; it must not outlive this object.
  std::function<void(const T&)> sink() {
    return [this](const T& v) {
      std::lock_guard lock(mutex_);
      value_ = v;
    };
  }
  std::optional<T> get() const {
    std::lock_guard lock(mutex_);
    return value_;
  }

 private:
  mutable std::mutex mutex_;
  std::optional<T> value_;
};

}  // namespace ddprun::test
