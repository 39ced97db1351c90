#pragma once
// A stop request for everything a process waits on: set once (by the first stop signal), seen at
// once by every wait that checks it, and able to cut a sleep short. Thread-safe.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>

namespace ddprun {

class StopSignal {
 public:
  // The first request wins; later ones are ignored.
  void request(int signo) {
    int none = 0;
    if (signo_.compare_exchange_strong(none, signo)) {
      source_.request_stop();
      std::lock_guard lock(mutex_);
      wake_.notify_all();
    }
  }
  bool requested() const { return signo_.load() != 0; }
  int signo() const { return signo_.load(); }
  std::stop_token token() const { return source_.get_token(); }
  // Sleeps for `d` unless a stop comes first; true if it did.
  bool sleep_for(std::chrono::milliseconds d) const {
    std::unique_lock lock(mutex_);
    std::stop_token token = source_.get_token();
    return wake_.wait_for(lock, token, d, [] { return false; }) || token.stop_requested();
  }

 private:
  std::atomic<int> signo_{0};
  std::stop_source source_;
  mutable std::mutex mutex_;
  mutable std::condition_variable_any wake_;
};

}  // namespace ddprun
