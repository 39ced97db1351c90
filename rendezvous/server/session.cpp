#include "rendezvous/server/session.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/host_port.hpp"

namespace ddprun::rdzv::server {

std::string format_sockaddr(const void* addr) {
  const auto* sa = static_cast<const sockaddr*>(addr);
  char text[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const auto* in = static_cast<const sockaddr_in*>(addr);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return format_host_port(text, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = static_cast<const sockaddr_in6*>(addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    return format_host_port(text, ntohs(in6->sin6_port));
  }
  return "<unknown peer>";
}

Session::Session(UniqueFd fd, std::string peer, core::KvStore& store, const core::Limits& limits,
                 std::function<void(Session&)> on_async_output, const core::StoreSecret* secret)
    : fd_(std::move(fd)),
      peer_(std::move(peer)),
      conn_(
          store, limits, [this, cb = std::move(on_async_output)] { cb(*this); }, secret) {}

Session::~Session() {
  conn_.release();
  close_socket();
}

void Session::close_socket() { fd_.reset(); }

Session::ReadStatus Session::read(std::span<char> scratch, size_t budget, size_t& received) {
  received = 0;
  while (received < budget) {
    const ssize_t n = ::recv(fd_.get(), scratch.data(), std::min(scratch.size(), budget - received), 0);
    if (n > 0) {
      input_.append(scratch.data(), static_cast<size_t>(n));
      received += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return ReadStatus::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ReadStatus::Drained;
    return ReadStatus::Closed;  // ECONNRESET and the like: the peer is gone
  }
  return ReadStatus::Budget;
}

bool Session::flush(size_t& sent, int& error) {
  sent = 0;
  core::OutputQueue& out = conn_.output();
  while (!out.empty()) {
    iovec iov[64];
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = out.gather(iov, std::size(iov));
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      out.consume(static_cast<size_t>(n));
      sent += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    error = errno;
    return false;
  }
  return true;
}

void Session::trim_input() {
  if (input_.empty() && input_.capacity() > 4096) std::string().swap(input_);
}

}  // namespace ddprun::rdzv::server
