#pragma once
// The store server's socket plumbing (server.cpp holds its event loop): the listening socket,
// keep-alive settings, peer addresses for the allow list, the spare descriptor for EMFILE.
// Internal to rendezvous/.

#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <string>

#include "common/unique_fd.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::rdzv::server {

boost::asio::ip::tcp::endpoint to_endpoint(const sockaddr_storage& ss, socklen_t len);
// A non-blocking, close-on-exec listening socket on host:port (port 0: the kernel picks); what it
// is bound to in `bound`. Throws ConnectionError naming the address and the reason.
UniqueFd listen_on(const std::string& host, uint16_t port, sockaddr_storage& bound, socklen_t& bound_len);
void set_keepalive(int fd, const ServerOptions& o);
// The peer's address as text, IPv4-mapped IPv6 addresses as IPv4.
std::string peer_address(const sockaddr_storage& ss);
std::string normalize_address(const std::string& a);
// A descriptor held in reserve, closed to accept-and-refuse when the process is out of them.
UniqueFd open_spare();
uint64_t open_file_limit();

}  // namespace ddprun::rdzv::server
