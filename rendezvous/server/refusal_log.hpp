#pragma once
// Log lines that a peer can cause, kept from filling the disk: the first event of a kind from an
// address in a window is logged in full, the others are counted, and the count is logged when the
// window ends ("412 more refused connections from 10.0.0.9 in the last 60 s"). At most `max_keys`
// kinds and addresses are tracked at a time; events beyond them are counted together. The server
// keeps one for refused connections (failed handshakes, requests outside a job) and one for the
// other connections it closes (bad requests, requests cut off, deadlines). Not thread-safe (the
// server's thread).

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace ddprun::rdzv::server {

class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  // `others`: what the events beyond `max_keys` are, for their count ("refused connections from
  // more addresses than 1024 at once"); `note`: said after each count (what they were), or "".
  RefusalLog(std::chrono::seconds window, std::string others, std::string note, size_t max_keys = 1024);

  // An event of `key` (an address, or an address and a reason). The first of its window is
  // logged as `line`; the count of the others is logged as "<n> more <what> in the last <s> s".
  void note(const std::string& key, const std::string& line, const std::string& what, Clock::time_point now);
  // Logs the counts of the windows that have ended (every window with `all`, at shutdown).
  void flush(Clock::time_point now, bool all = false);

 private:
  struct Window {
    Clock::time_point since;
    uint64_t more = 0;  // events not logged in full
    std::string what;
  };
  void report(const Window& w, Clock::time_point now) const;

  std::chrono::seconds window_;
  std::string note_;
  size_t max_keys_;
  std::map<std::string, Window> windows_;
  Window others_;  // keys beyond max_keys_
};

// The address part of "127.0.0.1:41234" or "[::1]:41234".
std::string peer_host(const std::string& peer);

}  // namespace ddprun::rdzv::server
