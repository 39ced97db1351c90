#pragma once
// Test helper: the daemon's tests' own frames of the 2.x wire protocol (docs: TCPSTORE_PROTOCOL),
// sent raw where a client library would not send them (half-sent, sliced, never read), and the
// check that a daemon still serves another client after what a test did to it.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/client/client.hpp"
#include "rendezvous/core/protocol.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::test {

using rdzv::core::put_bytes;
using rdzv::core::put_u32;
using rdzv::core::put_u64;
using rdzv::core::put_u8;

// 2.x frames (VALIDATE first), as PyTorch 2.x clients send them.
inline std::string v2_hello() {
  std::string s;
  put_u8(s, 0);
  put_u32(s, rdzv::core::kValidateMagic);
  return s;
}
inline std::string v2_set(const std::string& key, const std::string& value) {
  std::string s;
  put_u8(s, 1);
  put_bytes(s, key);
  put_bytes(s, value);
  return s;
}
inline std::string v2_get(const std::string& key) {
  std::string s;
  put_u8(s, 3);
  put_bytes(s, key);
  return s;
}
inline std::string v2_keys(uint8_t op, const std::vector<std::string>& keys) {
  std::string s;
  put_u8(s, op);
  put_u64(s, keys.size());
  for (const auto& k : keys) put_bytes(s, k);
  return s;
}
inline std::string v2_ping(uint32_t nonce) {
  std::string s;
  put_u8(s, 13);
  put_u32(s, nonce);
  return s;
}
inline constexpr uint8_t kV2Wait = 6, kV2MultiGet = 10, kV2CancelWait = 12;

inline rdzv::client::ClientOptions client_options(uint16_t port) {
  rdzv::client::ClientOptions o = test::store_client(port);
  o.timeout = std::chrono::seconds(20);
  return o;
}

// The daemon answers another client: a PING round trip and a read.
inline void expect_serving(Daemon& d) {
  ASSERT_TRUE(d.alive()) << "the daemon exited (status " << d.exit_status() << "):\n" << d.log();
  rdzv::client::Client c(client_options(d.port()));
  c.ping();
  c.set("still-serving", "yes");
  EXPECT_EQ(c.get("still-serving"), "yes");
}

}  // namespace ddprun::test
