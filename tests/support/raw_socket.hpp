#pragma once
// Test helper: a plain TCP socket for sending arbitrary bytes to a store and reading exactly what
// comes back, with a deadline on every read (a missing reply fails the test instead of hanging it).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ddprun::test {

class RawSocket {
 public:
  // Connects to `address`:`port` (IPv4), from `source` if given (127.0.0.x plays another host);
  // throws if the connection is refused.
  explicit RawSocket(uint16_t port, const char* address = "127.0.0.1", const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    if (source) {
      sockaddr_in src{};
      src.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &src.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
        throw std::runtime_error(std::string("bind ") + source + ": " + std::strerror(errno));
      }
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    ::inet_pton(AF_INET, address, &addr.sin_addr);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      throw std::runtime_error(std::string("connect: ") + std::strerror(err));
    }
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawSocket() { close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  int fd() const { return fd_; }

  // Sends all of `bytes`; false if the connection failed.
  bool send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads exactly `n` bytes; returns fewer if the peer closed or the deadline passed.
  std::string recv_exact(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::string out;
    out.resize(n);
    size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (got < n) {
      if (!wait_readable(deadline)) break;
      const ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    out.resize(got);
    return out;
  }

  // Reads until the peer closes (true) or the deadline passes (false); `read` gets the bytes.
  bool read_until_eof(std::string* read = nullptr, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[65536];
    for (;;) {
      if (!wait_readable(deadline)) return false;
      const ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return errno == ECONNRESET;
      if (r == 0) return true;
      if (read) read->append(buf, static_cast<size_t>(r));
    }
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  bool wait_readable(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
      if (rc > 0) return true;
      if (rc == 0) return false;
      if (errno != EINTR) return false;
    }
  }

  int fd_ = -1;
};

}  // namespace ddprun::test
