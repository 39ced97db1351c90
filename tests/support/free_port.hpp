#pragma once
// Test helper: a loopback port reserved for this test process, for flags that need a port known
// before the process that binds it starts (a node's --master_port, an etcd member's URLs).
//
// Probing a port with bind(0) and binding it later races: in between, the kernel may hand the same
// port to any connect() or bind(0) on the machine (it did, under a parallel ctest). A reserved port
// cannot be taken that way:
//   - it lies below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), from
//     which every kernel-picked port comes, so no connect() or bind(0) ever receives it;
//   - it is held by an exclusive lock file (/tmp/ddprun-test-ports/PORT) for the life of this
//     process, so no other test process (C++ or Python: tests/python/ports.py) reserves it too;
//   - one that something else already listens on is skipped.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>

namespace ddprun::test {

namespace port_detail {

// The first port of the kernel's ephemeral range (32768 unless configured otherwise).
inline int ephemeral_start() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0;
  int hi = 0;
  if (in >> lo >> hi && lo > 1024) return lo;
  return 32768;
}

inline bool bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // TIME_WAIT of an earlier test is fine
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace port_detail

// Whether a process has bound `port` (e.g. a ddprun now hosting its rendezvous store there): a
// probe by bind, which the process does not see (a connection would reach its store).
inline bool port_taken(int port) { return !port_detail::bindable(port); }

inline int free_port() {
  static std::mutex mu;
  static int next = -1;
  const std::lock_guard<std::mutex> lock(mu);
  constexpr int kLow = 10000;
  const int high = port_detail::ephemeral_start();  // exclusive
  const int span = high - kLow;
  if (span < 100) throw std::runtime_error("free_port: the ephemeral port range leaves no ports below it");
  if (next < 0)
    next = kLow + static_cast<int>((static_cast<unsigned>(::getpid()) * 7919u) % static_cast<unsigned>(span));
  ::mkdir("/tmp/ddprun-test-ports", 01777);
  for (int tries = 0; tries < span; ++tries) {
    const int port = next;
    next = next + 1 >= high ? kLow : next + 1;
    const std::string path = "/tmp/ddprun-test-ports/" + std::to_string(port);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      continue;
    }
    if (!port_detail::bindable(port)) {
      ::close(fd);
      continue;
    }
    return port;  // fd stays open (and locked) until this process exits
  }
  throw std::runtime_error("free_port: no port below the ephemeral range could be reserved");
}

}  // namespace ddprun::test
