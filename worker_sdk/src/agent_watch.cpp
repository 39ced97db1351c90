#include "agent_watch.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

namespace ddprun::worker::ft::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kValidateMagic = 0x3C85F7CE;
constexpr unsigned char kValidate = 0;
constexpr unsigned char kPing = 13;

void put_u32(unsigned char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));  // little-endian
}

// A connection to the store, with sends and receives bounded by `timeout`; -1 when none.
int connect_to(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  return fd;
}

bool send_all(int fd, const unsigned char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// One PING and its echo (a timeout of the socket's, a closed connection or another echo: false).
bool ping(int fd, uint32_t nonce) {
  unsigned char out[5] = {kPing};
  put_u32(out + 1, nonce);
  if (!send_all(fd, out, sizeof out)) return false;
  unsigned char in[4];
  size_t got = 0;
  while (got < sizeof in) {
    const ssize_t r = ::recv(fd, in + got, sizeof in - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  unsigned char want[4];
  put_u32(want, nonce);
  return std::memcmp(in, want, sizeof in) == 0;
}

}  // namespace

AgentWatch::AgentWatch(std::string host, uint16_t port, std::chrono::milliseconds patience)
    : host_(std::move(host)), port_(port), patience_(patience), thread_([this] { run(); }) {}

AgentWatch::~AgentWatch() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AgentWatch::run() {
  const auto interval = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), patience_ / 4);
  int fd = -1;
  uint32_t nonce = 0;
  auto since = Clock::now();  // the last sign of life
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval, [this] { return stopping_; })) {
    lock.unlock();
    const auto left = std::max<std::chrono::milliseconds>(
        std::chrono::milliseconds(100),
        patience_ - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since));
    if (fd < 0) {
      fd = connect_to(host_, port_, left);
      unsigned char validate[5] = {kValidate};
      put_u32(validate + 1, kValidateMagic);
      if (fd >= 0 && !send_all(fd, validate, sizeof validate)) {
        ::close(fd);
        fd = -1;
      }
    }
    if (fd >= 0 && ping(fd, ++nonce)) {
      since = Clock::now();
    } else {
      if (fd >= 0) ::close(fd);
      fd = -1;
      const auto silent = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - since);
      if (Clock::now() - since >= patience_) {
        const char* rank = std::getenv("RANK");
        std::cerr << "ddprun_ft: rank " << (rank ? rank : "?") << ": this rank's ddprun has not answered for "
                  << silent.count()
                  << " s (stopped, frozen or gone): the rank leaves, so that no other replica group waits for it "
                     "in a collective; its ddprun restarts it once it is back"
                  << std::endl;
        std::_Exit(1);
      }
    }
    lock.lock();
  }
  if (fd >= 0) ::close(fd);
}

}  // namespace ddprun::worker::ft::detail
