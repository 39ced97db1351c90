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
  ReadStatus status = ReadStatus::Budget;
  while (received < budget) {
    const ssize_t n = ::recv(fd_.get(), scratch.data(), std::min(scratch.size(), budget - received), 0);
    if (n > 0) {
      input_.append(scratch.data(), static_cast<size_t>(n));
      received += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // 0: the peer closed; EAGAIN: nothing more now; ECONNRESET and the like: the peer is gone.
    status = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? ReadStatus::Drained : ReadStatus::Closed;
    break;
  }
  note_arrival(received);
  return status;
}

void Session::note_arrival(size_t received) {
  if (received == 0) return;
  read_total_ += received;
  arrivals_.push_back({read_total_, std::chrono::steady_clock::now()});
  if (arrivals_.size() > kMaxArrivals) {
    arrivals_[arrivals_.size() - 2].end = read_total_;
    arrivals_.pop_back();
  }
}

void Session::consume_input(size_t used) {
  input_.erase(0, used);
  used_total_ += used;
  size_t gone = 0;
  while (gone < arrivals_.size() && arrivals_[gone].end <= used_total_) ++gone;
  arrivals_.erase(arrivals_.begin(), arrivals_.begin() + static_cast<std::ptrdiff_t>(gone));
  if (arrivals_.empty()) std::vector<Arrival>().swap(arrivals_);
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
  if (input_.empty()) {
    if (input_.capacity() > 4096) std::string().swap(input_);
    return;
  }
  // A few bytes left of a large read would keep the whole buffer: they get one of their size.
  if (input_.capacity() > 65536 && input_.size() < input_.capacity() / 4) input_.shrink_to_fit();
}

}  // namespace ddprun::rdzv::server
