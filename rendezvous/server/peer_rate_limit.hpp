#pragma once
// How often each peer may ask an HTTP endpoint that machines poll (the daemon's metrics port): a
// token bucket per peer address (an IPv6 peer by its /64, which one host holds whole; this host's
// loopback addresses, all of 127.0.0.0/8 and ::1, as one), `burst`
// requests at once and `per_second` after that. A request over the limit is told how long to
// wait (HTTP 429 with Retry-After). Peers tracked are bounded (`max_peers`): when that many are,
// those whose bucket has refilled are forgotten, and if none has, the oldest. Pure: the caller
// passes the time. Not thread-safe.

#include <boost/asio/ip/address.hpp>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>

namespace ddprun::rdzv::server {

struct PeerRateSettings {
  double burst = 60;
  double per_second = 10;
  size_t max_peers = 4096;
};

class PeerRateLimit {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PeerRateLimit(PeerRateSettings s = {}) : s_(s) {}

  // nullopt: `peer` may be answered now (a request is counted); else the whole seconds until it
  // may ask again (at least 1).
  std::optional<int> admit(const boost::asio::ip::address& peer, Clock::time_point now);
  size_t peers() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens = 0;
    Clock::time_point at;
  };
  void make_room(Clock::time_point now);

  PeerRateSettings s_;
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace ddprun::rdzv::server
