// Peers of a protected ddprun-rendezvous that never prove the secret: what they may send before
// the handshake, how long they may stay, how many there may be, and how much they may log.
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <latch>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "rendezvous/client/client.hpp"
#include "rendezvous/core/protocol.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/raw_socket.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
using rdzv::core::Dialect;
using rdzv::core::Op;

constexpr const char* kSecret = "this-is-the-cluster-secret-0123456789";

struct ProtectedDaemon {
  TempDir dir;
  std::string token;
  std::unique_ptr<Daemon> daemon;
  explicit ProtectedDaemon(std::vector<std::string> args = {}, std::optional<rlim_t> nofile = std::nullopt) {
    token = (dir.path / "token").string();
    std::ofstream(token) << kSecret << "\n";
    ::chmod(token.c_str(), 0600);
    DaemonOptions o;
    o.args = {"--token-file", token};
    o.args.insert(o.args.end(), args.begin(), args.end());
    o.nofile = nofile;
    daemon = std::make_unique<Daemon>(DAEMON_BIN, o);
  }
};

uint8_t wire(Op op) { return *rdzv::core::op_to_wire(Dialect::V2, op); }

// A 2.x client's first frame.
std::string validate() {
  std::string s;
  rdzv::core::put_u8(s, wire(Op::Validate));
  rdzv::core::put_u32(s, rdzv::core::kValidateMagic);
  return s;
}

// The daemon serves a client that holds the secret: a PING, a set and a get.
void expect_serving(uint16_t port) {
  rdzv::client::ClientOptions o = test::store_client(port);
  o.credentials = rdzv::core::Credentials{"*", kSecret};
  rdzv::client::Client c(o);
  c.ping();
  c.set("handshake_test/key", "value");
  EXPECT_EQ(c.get("handshake_test/key"), "value");
}

// Before: an unauthenticated MULTI_SET was decoded in full (up to 64 MiB per connection) before
// access was checked: ten such connections took the daemon from 5 MiB to 588 MiB.
TEST(HandshakeTest, BeforeTheHandshakeARequestOtherThanItsOwnIsRefusedAtItsFirstByte) {
  ProtectedDaemon pd;
  Daemon& d = *pd.daemon;
  const uint64_t rss_before = d.rss_kib();
  std::vector<std::unique_ptr<RawSocket>> socks;
  const std::string value(7 * 1024 * 1024, 'v');
  for (int i = 0; i < 10; ++i) {
    auto s = std::make_unique<RawSocket>(d.port());
    std::string frame = validate();
    rdzv::core::put_u8(frame, wire(Op::MultiSet));
    rdzv::core::put_u64(frame, 8);  // eight keys of 7 MiB each, each under the value limit; the last never comes
    bool open = s->send(frame);
    for (int k = 0; k < 7 && open; ++k) {
      std::string item;
      rdzv::core::put_bytes(item, "k" + std::to_string(k));
      rdzv::core::put_u64(item, value.size());
      open = s->send(item) && s->send(value);
    }
    socks.push_back(std::move(s));
  }
  for (auto& s : socks) {
    // Closed at its first byte: the rest of what it sent was never kept.
    EXPECT_TRUE(s->read_until_eof(nullptr, 3s)) << d.log();
  }
  EXPECT_LT(d.rss_kib(), rss_before + 32 * 1024) << "the daemon buffered what unauthenticated peers sent";
  EXPECT_NE(d.log().find("sent MULTI_SET before proving it holds the store's secret"), std::string::npos) << d.log();
  expect_serving(d.port());
}

// The handshake's own frames are held to the handshake's sizes: a 4 KiB AUTH_HELLO scope is
// refused as soon as its length is read.
TEST(HandshakeTest, AnOversizedHandshakeFrameIsRefusedFromItsLength) {
  ProtectedDaemon pd;
  Daemon& d = *pd.daemon;
  RawSocket s(d.port());
  std::string frame = validate();
  rdzv::core::put_u8(frame, wire(Op::AuthHello));
  rdzv::core::put_u32(frame, 1);
  rdzv::core::put_u64(frame, 4096);  // a scope under the key limit but over the handshake's; it never follows
  s.send(frame);
  EXPECT_TRUE(s.read_until_eof(nullptr, 10s)) << d.log();
  expect_serving(d.port());
}

// Before: a connection that never authenticated stayed open for as long as its peer liked.
TEST(HandshakeTest, AConnectionThatDoesNotAuthenticateInTimeIsClosed) {
  ProtectedDaemon pd({"--handshake-timeout", "1"});
  Daemon& d = *pd.daemon;
  RawSocket silent(d.port());
  RawSocket pinging(d.port());
  ASSERT_TRUE(pinging.send(validate()));
  // PING is allowed before the handshake, but does not extend it.
  for (int i = 0; i < 3; ++i) {
    std::string ping;
    rdzv::core::put_u8(ping, wire(Op::Ping));
    rdzv::core::put_u32(ping, static_cast<uint32_t>(i));
    if (!pinging.send(ping)) break;
    if (pinging.recv_exact(4, 5s).size() != 4) break;
  }
  EXPECT_TRUE(silent.read_until_eof(nullptr, 30s)) << d.log();
  EXPECT_TRUE(pinging.read_until_eof(nullptr, 30s)) << d.log();
  EXPECT_NE(d.log().find("did not prove the store's secret within 1 s"), std::string::npos) << d.log();
  expect_serving(d.port());
}

// Before: under a descriptor limit of 300, 400 idle unauthenticated connections locked legitimate
// clients out for as long as they stayed open. The oldest of them now make room.
TEST(HandshakeTest, IdleUnauthenticatedConnectionsCannotLockOutAClientWithTheSecret) {
  ProtectedDaemon pd({}, 300);
  Daemon& d = *pd.daemon;
  std::vector<std::unique_ptr<RawSocket>> idle;
  for (int i = 0; i < 400; ++i) idle.push_back(std::make_unique<RawSocket>(d.port()));
  expect_serving(d.port());
  EXPECT_TRUE(d.alive());
}

// Before: a connection that had sent one byte counted as in the middle of its handshake, was never
// closed to make room, and stayed for the handshake's deadline (10 s): peers that kept the cap of
// such connections filled, reconnecting as each was closed, kept every client with the secret out.
// Now the oldest makes room for a newcomer once it has had its grace, whatever it sent: under the
// same peers, every client with the secret is served, each well within its 10 s.
TEST(HandshakeTest, PeersThatSendOneByteAndStopCannotLockOutAClientWithTheSecret) {
  ProtectedDaemon pd({"--max-pending-handshakes", "8"});
  Daemon& d = *pd.daemon;
  constexpr size_t kPeers = 64;
  const std::string one_byte = validate().substr(0, 1);
  std::vector<std::unique_ptr<RawSocket>> peers;
  for (size_t i = 0; i < kPeers; ++i) {
    peers.push_back(std::make_unique<RawSocket>(d.port()));
    peers.back()->send(one_byte);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> reopened{0};
  std::thread attacker([&] {
    std::vector<pollfd> fds(kPeers);
    while (!stop) {
      for (size_t i = 0; i < kPeers; ++i) fds[i] = pollfd{peers[i]->fd(), POLLIN, 0};
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      for (size_t i = 0; i < kPeers && !stop; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        try {
          peers[i] = std::make_unique<RawSocket>(d.port());  // closed: take its place again at once
          peers[i]->send(one_byte);
          ++reopened;
        } catch (const std::exception&) {
        }
      }
    }
  });
  int served = 0;
  std::string first_error;
  for (int i = 0; i < 5; ++i) {
    try {
      rdzv::client::ClientOptions o = test::store_client(d.port(), 10s);
      o.credentials = rdzv::core::Credentials{"*", kSecret};
      rdzv::client::Client c(o);
      c.set("lockout/" + std::to_string(i), "x");
      ++served;
    } catch (const std::exception& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  stop = true;
  attacker.join();
  EXPECT_EQ(served, 5) << first_error << "\n" << d.log().substr(0, 4000);
  EXPECT_GT(reopened.load(), 0) << "the peers were never closed";
  EXPECT_TRUE(d.alive());
}

// The daemon's count of connections it closed because they had not proved the secret (a
// deadline passed, or room was made), from its /metrics; -1 if it cannot be read.
long closed_without_handshake(const Daemon& d) {
  const std::string marker = "metrics on http://127.0.0.1:";
  const std::string log = d.log_with(marker);
  const size_t at = log.find(marker);
  if (at == std::string::npos) return -1;
  RawSocket s(static_cast<uint16_t>(std::stoi(log.substr(at + marker.size()))));
  std::string answer;
  if (!s.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") || !s.read_until_eof(&answer, 10s)) return -1;
  const std::string sample = "ddprun_store_connections_closed_total{reason=\"no_handshake\"} ";
  const size_t value = answer.find(sample);
  return value == std::string::npos ? -1 : std::stol(answer.substr(value + sample.size()));
}

// Before: at the cap of connections that had not proved the secret, the oldest was closed to make
// room even in the middle of its handshake, so a burst of honest clients larger than the cap
// (2048 agents started at once by a scheduler) kept closing each other's connections and none got
// through. Now the server waits with accepting while the cap is reached, until the oldest has had
// its grace (500 ms): then it is closed to make room, by design (it holds a place as a slowloris
// would): on a loaded machine a client thread of the 400 can be kept off the CPU that long in its
// handshake; it connects again and is served. So the test asks that every client is served and
// that such closes stay a few, never the churn of before.
TEST(HandshakeTest, ABurstOfClientsWithTheSecretLargerThanTheCapIsAllAdmitted) {
  ProtectedDaemon pd({"--max-pending-handshakes", "4", "--metrics-port", "0"});
  Daemon& d = *pd.daemon;
  constexpr int kClients = 400;
  std::atomic<int> served{0};
  std::mutex mutex;
  std::string first_error;
  std::latch go(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      go.arrive_and_wait();
      try {
        rdzv::client::ClientOptions o;
        o.host = "127.0.0.1";
        o.port = d.port();
        o.connect_timeout = 60s;
        o.timeout = 60s;
        o.credentials = rdzv::core::Credentials{"*", kSecret};
        rdzv::client::Client c(o);
        c.set("burst/" + std::to_string(i), "x");
        ++served;
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        if (first_error.empty()) first_error = e.what();
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(served.load(), kClients) << first_error << "\n" << d.log().substr(0, 4000);
  const long closed = closed_without_handshake(d);
  EXPECT_GE(closed, 0) << "no ddprun_store_connections_closed_total{reason=\"no_handshake\"} in /metrics";
  EXPECT_LT(closed, kClients / 10) << "honest clients' connections were closed to make room\n"
                                   << d.log().substr(0, 4000);
}

// Before: one WARN line per refused connection, without limit.
TEST(HandshakeTest, RefusedConnectionsFromOneAddressAreLoggedOnceAndCounted) {
  ProtectedDaemon pd;
  Daemon& d = *pd.daemon;
  std::string set = validate();
  rdzv::core::put_u8(set, wire(Op::Set));
  rdzv::core::put_bytes(set, "k");
  rdzv::core::put_bytes(set, "v");
  for (int i = 0; i < 300; ++i) {
    RawSocket s(d.port());
    s.send(set);
    ASSERT_TRUE(s.read_until_eof(nullptr, 10s));
  }
  expect_serving(d.port());
  EXPECT_EQ(d.log_count("access denied"), 1u) << d.log().substr(0, 4000);
  d.stop(SIGTERM);
  // The count of what was not logged comes out at the end of its window, or at shutdown.
  EXPECT_NE(d.log().find("299 more refused connections from 127.0.0.1 in the last"), std::string::npos)
      << d.log().substr(0, 4000);
}

}  // namespace
}  // namespace ddprun::test
