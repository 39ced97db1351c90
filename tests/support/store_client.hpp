#pragma once
// Test helper: how a test reaches a store on this host: a client's options for 127.0.0.1:`port`,
// with `timeout` for connecting and for each request (a test sets the rest: credentials, a
// different request deadline, outage tolerance).

#include <chrono>
#include <cstdint>

#include "rendezvous/client/client.hpp"

namespace ddprun::test {

inline rdzv::client::ClientOptions store_client(uint16_t port,
                                                std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  rdzv::client::ClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = timeout;
  o.timeout = timeout;
  return o;
}

}  // namespace ddprun::test
