#pragma once
// LibTorch's c10d::TCPStore options that work with every LibTorch ddprun supports (1.13 to 2.x).
//
// LibTorch >= 2.4 defaults TCPStoreOptions::useLibUV to true and refuses to create any TCPStore,
// client or server, when it was built without the libuv backend (Debian 13's LibTorch 2.6:
// "use_libuv was requested but PyTorch was build without libuv support"). A client never needs
// libuv (the option picks the server's event loop), so clients turn it off; a server uses
// libuv where this LibTorch has it.

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace ddprun::worker {

namespace tcp_store_detail {
template <typename O>
auto set_libuv(O& o, bool on, int) -> decltype(o.useLibUV = on, void()) {
  o.useLibUV = on;
}
template <typename O>
void set_libuv(O&, bool, long) {}  // LibTorch < 2.2: no libuv option, the classic backend

}  // namespace tcp_store_detail

// Options for a client of the store at PORT (MASTER_PORT).
inline c10d::TCPStoreOptions tcp_store_client_options(uint16_t port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  tcp_store_detail::set_libuv(o, false, 0);
  return o;
}

// LibTorch's own server on PORT (0: the kernel picks): the libuv backend where this LibTorch has
// it (the default of LibTorch >= 2.4), the classic one otherwise.
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store_server(const std::string& host, uint16_t port,
                                                                std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o = tcp_store_client_options(port, timeout);
  o.isServer = true;
  tcp_store_detail::set_libuv(o, true, 0);
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception&) {
    tcp_store_detail::set_libuv(o, false, 0);  // built without libuv
    return c10::make_intrusive<c10d::TCPStore>(host, o);
  }
}

}  // namespace ddprun::worker
