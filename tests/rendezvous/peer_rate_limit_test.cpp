// The metrics port's limit per peer (server/peer_rate_limit.hpp): a burst, then a rate, told how
// long to wait; peers apart (this host's loopback addresses one); the number of peers tracked bounded.
#include <gtest/gtest.h>

#include <boost/asio/ip/address.hpp>
#include <chrono>

#include "rendezvous/server/peer_rate_limit.hpp"

namespace ddprun::rdzv {
namespace {

using server::PeerRateLimit;
using server::PeerRateSettings;
using namespace std::chrono_literals;
namespace ip = boost::asio::ip;

TEST(PeerRateLimitTest, ABurstThenARatePerPeerAndHowLongToWait) {
  PeerRateLimit limit(PeerRateSettings{5, 2, 16});
  const auto t0 = PeerRateLimit::Clock::time_point{} + 100s;
  const auto a = ip::make_address("10.0.0.2"), b = ip::make_address("10.0.0.3");
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limit.admit(a, t0)) << i;
  EXPECT_EQ(limit.admit(a, t0), 1);          // half a second to the next token: 1 s, rounded up
  EXPECT_FALSE(limit.admit(b, t0));          // another peer has its own bucket
  EXPECT_FALSE(limit.admit(a, t0 + 500ms));  // 2 a second
  EXPECT_EQ(limit.admit(a, t0 + 500ms), 1);
  EXPECT_FALSE(limit.admit(a, t0 + 1000ms));
  PeerRateLimit slow(PeerRateSettings{1, 0.1, 16});
  EXPECT_FALSE(slow.admit(a, t0));
  EXPECT_EQ(slow.admit(a, t0), 10);  // one every 10 s
}

TEST(PeerRateLimitTest, AnIpv6HostIsOnePeerAndIpv4MappedIsItsIpv4) {
  PeerRateLimit limit(PeerRateSettings{2, 1, 16});
  const auto t0 = PeerRateLimit::Clock::time_point{} + 100s;
  EXPECT_FALSE(limit.admit(ip::make_address("2001:db8::1"), t0));
  EXPECT_FALSE(limit.admit(ip::make_address("2001:db8::ffff:2"), t0));  // the same /64
  EXPECT_TRUE(limit.admit(ip::make_address("2001:db8::3"), t0));
  EXPECT_FALSE(limit.admit(ip::make_address("2001:db8:0:1::1"), t0));  // another /64
  EXPECT_FALSE(limit.admit(ip::make_address("10.0.0.1"), t0));
  EXPECT_FALSE(limit.admit(ip::make_address("::ffff:10.0.0.1"), t0));
  EXPECT_TRUE(limit.admit(ip::make_address("10.0.0.1"), t0));
}

// Before: each loopback address had its own bucket, so a peer on this host that went through
// 127.0.0.2, 127.0.0.3, ... was never limited.
TEST(PeerRateLimitTest, EveryLoopbackAddressIsOnePeer) {
  PeerRateLimit limit(PeerRateSettings{2, 1, 16});
  const auto t0 = PeerRateLimit::Clock::time_point{} + 100s;
  EXPECT_FALSE(limit.admit(ip::make_address("127.0.0.1"), t0));
  EXPECT_FALSE(limit.admit(ip::make_address("127.0.0.2"), t0));
  EXPECT_TRUE(limit.admit(ip::make_address("127.255.0.9"), t0));
  EXPECT_TRUE(limit.admit(ip::make_address("::1"), t0));
  EXPECT_TRUE(limit.admit(ip::make_address("::ffff:127.0.0.5"), t0));
  EXPECT_EQ(limit.peers(), 1u);
}

TEST(PeerRateLimitTest, PeersTrackedAreBounded) {
  PeerRateLimit limit(PeerRateSettings{3, 1, 8});
  const auto t0 = PeerRateLimit::Clock::time_point{} + 100s;
  for (int i = 0; i < 100; ++i) {
    limit.admit(ip::make_address_v4(static_cast<ip::address_v4::uint_type>(0x0a000000 + i)), t0);
    EXPECT_LE(limit.peers(), 8u);
  }
  // Peers whose bucket has refilled go first; a busy peer is still limited.
  const auto busy = ip::make_address("192.0.2.1");
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(limit.admit(busy, t0 + 10s));
  EXPECT_TRUE(limit.admit(busy, t0 + 10s));
  EXPECT_LE(limit.peers(), 8u);
}

}  // namespace
}  // namespace ddprun::rdzv
