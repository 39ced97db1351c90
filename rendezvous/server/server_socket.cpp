#include "rendezvous/server/server_socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/host_port.hpp"
#include "common/errors.hpp"
#include "common/unique_fd.hpp"

namespace ddprun::rdzv::server {

using boost::asio::ip::tcp;

tcp::endpoint to_endpoint(const sockaddr_storage& ss, socklen_t len) {
  tcp::endpoint ep;
  std::memcpy(ep.data(), &ss, len);
  ep.resize(len);
  return ep;
}

// Binds and listens; returns the descriptor. Throws ConnectionError naming the address.
UniqueFd listen_on(const std::string& host, uint16_t port, sockaddr_storage& bound, socklen_t& bound_len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string name = host.empty() ? "::" : host;
  const int gai = ::getaddrinfo(name.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0 || res == nullptr) {
    throw ConnectionError("cannot bind the store to '" + host + "': the name does not resolve (" +
                          std::string(::gai_strerror(gai)) + "); pass a numeric address such as 127.0.0.1 or ::");
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  const tcp::endpoint wanted =
      to_endpoint(*reinterpret_cast<const sockaddr_storage*>(res->ai_addr), static_cast<socklen_t>(res->ai_addrlen));
  auto fail = [&](int err) -> UniqueFd {
    throw ConnectionError("cannot listen on " + format_endpoint(wanted) + ": " + std::strerror(err) +
                          (err == EADDRINUSE ? " (another process holds this port; pass port 0 to let the kernel "
                                               "pick a free one)"
                                             : ""));
  };
  UniqueFd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return fail(errno);
  const int one = 1, zero = 0;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (res->ai_family == AF_INET6) {
    // "::" serves IPv4 clients too (as PyTorch's libuv server does), where the host allows it.
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(res->ai_addr);
    if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0) return fail(errno);
  // The kernel caps the backlog at net.core.somaxconn; ask for the most it allows.
  if (::listen(fd.get(), 65535) != 0) return fail(errno);
  bound_len = sizeof bound;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len);
  return fd;
}

void set_keepalive(int fd, const ServerOptions& o) {
  const int one = 1;
  const int idle = static_cast<int>(o.keepalive_idle.count());
  const int interval = static_cast<int>(o.keepalive_interval.count());
  const int probes = o.keepalive_probes;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// A peer's numeric address, IPv4-mapped IPv6 written as IPv4 (the form allow lists use).
std::string peer_address(const sockaddr_storage& ss) {
  char text[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, text, sizeof text);
  } else if (ss.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) ::inet_ntop(AF_INET, &a6.s6_addr[12], text, sizeof text);
    else ::inet_ntop(AF_INET6, &a6, text, sizeof text);
  }
  return text;
}

// "::ffff:10.0.0.1" -> "10.0.0.1"; other addresses as given.
std::string normalize_address(const std::string& a) {
  in6_addr a6{};
  if (::inet_pton(AF_INET6, a.c_str(), &a6) == 1 && IN6_IS_ADDR_V4MAPPED(&a6)) {
    char text[INET_ADDRSTRLEN] = "";
    ::inet_ntop(AF_INET, &a6.s6_addr[12], text, sizeof text);
    return text;
  }
  return a;
}

UniqueFd open_spare() { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

uint64_t open_file_limit() {
  rlimit lim{};
  return ::getrlimit(RLIMIT_NOFILE, &lim) == 0 ? lim.rlim_cur : 0;
}

}  // namespace ddprun::rdzv::server

namespace ddprun::rdzv::server {

std::string format_endpoint(const boost::asio::ip::tcp::endpoint& ep) {
  return format_host_port(ep.address().to_string(), ep.port());
}

}  // namespace ddprun::rdzv::server
