// A store that does not answer for a while (its host frozen, the network cut) is an outage that
// ddprun's client rides out when the store describes itself: it gives the request up at its
// deadline, connects again, and finds the same store, its contents intact. Before, a request
// without a reply ended the client's connection for good ("the connection to store ... was lost"),
// and a connection lost during the secret handshake read as a refused secret.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "common/errors.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/core/protocol.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

rdzv::client::ClientOptions options(uint16_t port) {
  rdzv::client::ClientOptions o = test::store_client(port, 5s);
  o.timeout = 1s;  // a frozen store is given up on quickly, and connected to again
  o.outage_tolerance = 30s;
  return o;
}

// The daemon stopped (SIGSTOP) for 3 s while an ADD is under way: the ADD times out, is sent again
// over a new connection once the daemon runs, and counts once.
TEST(StoreOutageTest, AFrozenStoreIsWaitedForAndARetriedAddCountsOnce) {
  Daemon daemon(DAEMON_BIN);
  rdzv::client::Client c(options(daemon.port()));
  ASSERT_TRUE(c.rides_out_outages()) << "ddprun-rendezvous describes itself, state file or not";
  EXPECT_EQ(c.add("counter", 1), 1);
  ASSERT_EQ(::kill(daemon.pid(), SIGSTOP), 0);
  auto thaw = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(3s);  // sleep override: how long the store's host is frozen
    ::kill(daemon.pid(), SIGCONT);
  });
  EXPECT_EQ(c.add("counter", 1), 2);
  thaw.get();
  EXPECT_GE(c.reconnects(), 1u);
  rdzv::client::ClientOptions plain = options(daemon.port());
  plain.outage_tolerance = 0ms;
  rdzv::client::Client other(plain);
  EXPECT_EQ(other.add("counter", 0), 2) << "the ADD sent twice was applied twice";
  EXPECT_TRUE(daemon.alive());
}

// A store without a state file that ends is not waited for: the reconnection is refused, and the
// call fails at once with why.
TEST(StoreOutageTest, AStoreWithoutStateThatEndedIsNotWaitedFor) {
  auto daemon = std::make_unique<Daemon>(DAEMON_BIN);
  rdzv::client::ClientOptions o = options(daemon->port());
  o.timeout = 5s;
  rdzv::client::Client c(o);
  c.set("k", "v");
  daemon->stop(SIGKILL);
  try {
    c.get("k");
    FAIL() << "a store that ended was waited for";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("refused the connection (nothing listens there any more)"), std::string::npos)
        << e.what();
  }
}

// A stand-in for a protected store that closes every connection right after the client's proof,
// without a word: as a partition or a crash mid-handshake looks to the client. `mode` is what it
// answers AUTH_HELLO with.
class ClosingAtTheProof {
 public:
  explicit ClosingAtTheProof(uint8_t mode) : mode_(mode) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("cannot listen on loopback");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ClosingAtTheProof() {
    done_ = true;
    thread_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }
  int connections() const { return connections_.load(); }

 private:
  // Reads what arrives within `wait`.
  static std::string read_some(int fd, std::chrono::milliseconds wait) {
    std::string got;
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, static_cast<int>(wait.count())) > 0) {
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
      wait = 100ms;  // the rest of a burst
    }
    return got;
  }
  void serve() {
    while (!done_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      ++connections_;
      // VALIDATE (5 bytes), PING (1 + u32 nonce), AUTH_HELLO: answer the PING and challenge.
      const std::string hello = read_some(conn, 2s);
      if (hello.size() >= 10) {
        std::string reply = hello.substr(6, 4);  // the PING's nonce, echoed
        rdzv::core::put_u8(reply, mode_);
        rdzv::core::put_bytes(reply, std::string(rdzv::core::kNonceBytes, 'n'));
        ::send(conn, reply.data(), reply.size(), MSG_NOSIGNAL);
        read_some(conn, 2s);  // the proof, with the first request
      }
      ::close(conn);  // not a word about the proof
    }
  }

  uint8_t mode_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> done_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

rdzv::client::ClientOptions protected_client(uint16_t port) {
  rdzv::client::ClientOptions o = options(port);
  o.connect_timeout = 2s;
  o.credentials = rdzv::core::Credentials{"job", std::string(32, 'k')};
  return o;
}

// A store that says its refusals (mode 2) and closes without one lost the connection: the client
// keeps trying until its connect timeout, and never says the secret was refused.
TEST(StoreOutageTest, AConnectionLostAtTheProofIsNoRefusedSecret) {
  ClosingAtTheProof store(rdzv::core::kAuthProveSaysRefusal);
  try {
    rdzv::client::Client c(protected_client(store.port()));
    FAIL() << "connected to a store that closes every connection";
  } catch (const ConfigError& e) {
    FAIL() << "a lost connection was taken for a refused secret: " << e.what();
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("closed the connection during AUTH_PROOF"), std::string::npos) << e.what();
  }
  EXPECT_GE(store.connections(), 2) << "the client did not try again";
}

// An older store (mode 1) refuses by closing: that stays a refused secret, said at once.
TEST(StoreOutageTest, AnOlderStoresCloseAtTheProofIsARefusedSecret) {
  ClosingAtTheProof store(rdzv::core::kAuthProve);
  try {
    rdzv::client::Client c(protected_client(store.port()));
    FAIL() << "connected to a store that closes every connection";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this client's secret for job 'job'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.connections(), 1);
}

}  // namespace
}  // namespace ddprun::test
