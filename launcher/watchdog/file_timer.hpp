#pragma once
// torchelastic's named-pipe watchdog, as torchrun serves it when TORCHELASTIC_ENABLE_FILE_TIMER=1:
// workers using torch.distributed.elastic.timer.FileTimerClient (expires(after=..., scope=...))
// write JSON lines to a FIFO,
//   {"version": 1, "pid": P, "scope_id": S, "expiration_time": T, "signal": N}
// where T is a wall-clock time in seconds (a negative T releases the timer). When a timer expires
// the server signals its pid with N (N <= 0: no signal, only the report), the way
// FileTimerServer does; ddprun first hands the expiry to a callback that captures the worker's
// stacks.
//
// Unlike torchrun's server, only a process of this node's workers is ever signalled (`owner`
// decides), so a request naming another pid is refused and logged, and the FIFO is created 0600 in
// ddprun's private run directory unless TORCHELASTIC_TIMER_FILE names one.

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/unique_fd.hpp"

namespace ddprun::launcher::watchdog {

struct TimerExpiry {
  pid_t pid = -1;
  std::string scope;
  int signal = 0;
  double expiration_time = 0;  // seconds since the epoch
};

class FileTimerServer {
 public:
  // Creates the FIFO at `path` (replacing whatever is there) and starts serving it. `owner(pid)`:
  // the rank whose worker `pid` belongs to, or -1. `on_expired` runs on the server's thread before
  // the signal is sent. Throws ProcessError if the FIFO cannot be created.
  FileTimerServer(std::string path, std::function<int(pid_t)> owner,
                  std::function<void(const TimerExpiry&, int rank)> on_expired);
  ~FileTimerServer();  // stops the thread and removes the FIFO
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  uint64_t requests() const { return requests_; }

  // One request line; returns why it was refused, or "" (for tests, and the serving loop).
  std::string handle_line(const std::string& line);
  // Fires the timers that expired by `now` (seconds since the epoch).
  void expire(double now);

 private:
  void serve();

  std::string path_;
  std::function<int(pid_t)> owner_;
  std::function<void(const TimerExpiry&, int)> on_expired_;
  UniqueFd read_fd_;
  UniqueFd keep_open_fd_;            // a writer of our own, so the FIFO never reads as closed
  UniqueFd wake_read_, wake_write_;  // a pipe that ends serve()'s poll
  std::thread thread_;
  std::mutex mutex_;
  std::map<std::pair<pid_t, std::string>, TimerExpiry> timers_;
  std::atomic<uint64_t> requests_{0};
  std::string partial_;
  uint64_t refused_logged_ = 0;
};

}  // namespace ddprun::launcher::watchdog
