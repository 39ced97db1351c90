#pragma once
// ddprun's console: its stdout and stderr, written by a thread of their own so that a console that
// does not keep up (a pipe nobody reads, a terminal scrolled back, a stopped pager) never blocks
// supervision: the supervisor queues whole lines and goes on reaping, forwarding signals and
// watching other nodes. The queue is bounded; when the console falls further behind, new batches
// are dropped and counted, and the owner is told once so it can say so. Per-rank log files
// (--tee/--redirects) are written by the supervisor itself and keep everything.
//
// The file descriptor's flags are left alone (making a terminal or a shell's pipe non-blocking
// would change it for every process sharing it). Thread-safe: write() may be called from any
// thread. The destructor gives the console a short time to drain, then interrupts a write that is
// still blocked and drops the rest.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace ddprun::launcher::workers {

class ConsoleWriter {
 public:
  static constexpr size_t kDefaultCapacity = size_t{4} << 20;

  // `on_first_drop` runs once (on the caller's thread) when output is first dropped.
  ConsoleWriter(int fd, size_t capacity = kDefaultCapacity, std::function<void()> on_first_drop = {});
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  // Queues `bytes` (whole lines) without blocking; drops them if the console is too far behind.
  void write(std::string_view bytes);
  // Waits up to `timeout` for everything queued to be written; false if it was not.
  bool drain(std::chrono::milliseconds timeout);
  uint64_t dropped_bytes() const { return dropped_.load(); }
  int fd() const { return fd_; }

 private:
  void run();

  int fd_;
  size_t capacity_;
  std::function<void()> on_first_drop_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::string queue_;
  bool writing_ = false;
  bool stop_ = false;
  bool broken_ = false;  // the console is gone (EPIPE, EBADF): nothing more to write
  std::atomic<uint64_t> dropped_{0};
  std::atomic<bool> announced_{false};
  std::atomic<bool> exited_{false};
  std::thread thread_;
};

// The two consoles of this process, set by the agent for as long as it runs (null otherwise:
// callers then write directly). ddprun's own log lines go through the stderr writer too (see
// log::set_sink), so that they never block supervision either.
struct Consoles {
  ConsoleWriter* out = nullptr;
  ConsoleWriter* err = nullptr;
};
Consoles& consoles();

}  // namespace ddprun::launcher::workers
