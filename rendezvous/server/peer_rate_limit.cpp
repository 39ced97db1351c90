#include "rendezvous/server/peer_rate_limit.hpp"

#include <algorithm>
#include <cmath>

namespace ddprun::rdzv::server {

namespace {

// The bucket's name: an IPv4 address (or an IPv4-mapped IPv6 one) whole, an IPv6 address's /64,
// and every loopback address one name: 127.0.0.0/8 and ::1 are all this host, and a peer here
// that went through them would have 16 million buckets.
std::string peer_key(const boost::asio::ip::address& peer) {
  if (peer.is_loopback()) return "loopback";
  if (peer.is_v4()) return peer.to_string();
  const auto v6 = peer.to_v6();
  if (v6.is_v4_mapped()) {
    const auto v4 = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, v6);
    return v4.is_loopback() ? "loopback" : v4.to_string();
  }
  const auto bytes = v6.to_bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), 8);
}

}  // namespace

std::optional<int> PeerRateLimit::admit(const boost::asio::ip::address& peer, Clock::time_point now) {
  const std::string key = peer_key(peer);
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    if (buckets_.size() >= s_.max_peers) make_room(now);
    it = buckets_.emplace(key, Bucket{s_.burst, now}).first;
  }
  Bucket& b = it->second;
  const double elapsed = std::chrono::duration<double>(now - b.at).count();
  b.tokens = std::min(s_.burst, b.tokens + std::max(0.0, elapsed) * s_.per_second);
  b.at = now;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return std::nullopt;
  }
  return std::max(1, static_cast<int>(std::ceil((1 - b.tokens) / s_.per_second)));
}

void PeerRateLimit::make_room(Clock::time_point now) {
  // Full again: forgetting such a peer changes nothing for it.
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    const double idle = std::chrono::duration<double>(now - it->second.at).count();
    it = it->second.tokens + idle * s_.per_second >= s_.burst ? buckets_.erase(it) : std::next(it);
  }
  if (buckets_.size() < s_.max_peers) return;
  auto oldest = std::min_element(buckets_.begin(), buckets_.end(),
                                 [](const auto& a, const auto& b) { return a.second.at < b.second.at; });
  buckets_.erase(oldest);
}

}  // namespace ddprun::rdzv::server
