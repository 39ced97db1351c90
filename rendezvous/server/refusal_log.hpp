#pragma once
// Refused connections, logged so that a flood cannot fill the disk: the first refusal from an
// address in a window is logged in full, the others are counted, and the count is logged when the
// window ends ("412 more refused connections from 10.0.0.9 in the last 60 s"). At most
// `max_addresses` addresses are tracked at a time; refusals from more are counted together.
// Not thread-safe (the server's thread).

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace ddprun::rdzv::server {

class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RefusalLog(std::chrono::seconds window, size_t max_addresses = 1024);

  // A connection from `address` was refused; `line` says which and why.
  void refused(const std::string& address, const std::string& line, Clock::time_point now);
  // Logs the counts of the windows that have ended (every window with `all`, at shutdown).
  void flush(Clock::time_point now, bool all = false);

 private:
  struct Window {
    Clock::time_point since;
    uint64_t more = 0;  // refusals not logged in full
  };
  void report(const std::string& from, const Window& w, Clock::time_point now) const;

  std::chrono::seconds window_;
  size_t max_addresses_;
  std::map<std::string, Window> windows_;
  Window others_;  // addresses beyond max_addresses_
};

// The address part of "127.0.0.1:41234" or "[::1]:41234".
std::string peer_host(const std::string& peer);

}  // namespace ddprun::rdzv::server
