// Our client against our server over real loopback sockets, plus raw sockets sending bad input.
#include "rendezvous/server/server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "common/errors.hpp"
#include "rendezvous/client/client.hpp"
#include "tests/support/hex.hpp"
#include "tests/support/raw_socket.hpp"
#include "tests/support/wait_until.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;
using test::unhex;
using test::wait_until;

client::ClientOptions client_options(uint16_t port) { return test::store_client(port, 5s); }

// A plain blocking socket for sending arbitrary bytes.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throw std::runtime_error("connect");
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawSocket() { close(); }
  void send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
  }
  // Bytes until EOF (or the 5 s receive timeout, which fails the caller's expectation).
  std::string read_until_eof(bool* eof) {
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      *eof = n == 0 || errno == ECONNRESET;
      return out;
    }
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// The server's state, changed by its own thread.
bool eventually(const std::function<bool()>& pred) { return wait_until(pred, 5s, 0ms); }

TEST(ServerTest, BindsKernelPickedPortAndServesEveryV2Operation) {
  server::ServerThread server(server::ServerOptions{});
  ASSERT_NE(server.port(), 0);
  client::Client c(client_options(server.port()));
  EXPECT_FALSE(c.check({"absent"}));  // connected and answered: nothing of it left to count below
  const uint64_t served = server.stats().requests;
  EXPECT_NO_THROW(c.ping()) << "the server echoes PING's nonce";
  EXPECT_EQ(server.stats().requests, served + 1) << "a PING is one request, answered";
  c.set("a", "1");
  EXPECT_EQ(c.get("a"), "1");
  EXPECT_EQ(c.add("n", 7), 7);
  EXPECT_EQ(c.add("n", -10), -3);
  EXPECT_EQ(c.compare_set("cas", "", "x"), "x");
  EXPECT_EQ(c.compare_set("cas", "y", "z"), "x");
  EXPECT_TRUE(c.check({"a", "n"}));
  EXPECT_FALSE(c.check({"a", "missing"}));
  c.append("a", "23");
  EXPECT_EQ(c.get("a"), "123");
  c.multi_set({{"m1", "v1"}, {"m2", "v2"}});
  EXPECT_EQ(c.multi_get({"m2", "m1"}), (std::vector<std::string>{"v2", "v1"}));
  EXPECT_EQ(c.num_keys(), 5);
  EXPECT_TRUE(c.delete_key("m1"));
  EXPECT_FALSE(c.delete_key("m1"));
  EXPECT_EQ(c.list(), (std::vector<std::string>{"a", "cas", "m2", "n"}));
  c.queue_push("q", "one");
  c.queue_push("q", "two");
  EXPECT_EQ(c.queue_len("q"), 2);
  EXPECT_EQ(c.queue_pop("q"), "one");
  EXPECT_EQ(c.queue_pop("q"), "two");
  EXPECT_EQ(c.queue_pop("q"), std::nullopt);
}

TEST(ServerTest, GetBlocksUntilAnotherClientSetsTheKey) {
  server::ServerThread server(server::ServerOptions{});
  client::Client waiter(client_options(server.port()));
  client::Client setter(client_options(server.port()));
  auto value = std::async(std::launch::async, [&] { return waiter.get("late"); });
  EXPECT_TRUE(eventually([&] { return server.stats().waiting_clients == 1; }));
  setter.set("late", "here");
  ASSERT_EQ(value.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(value.get(), "here");
}

TEST(ServerTest, WaitTimeoutCancelsOnServerAndNamesMissingKeys) {
  server::ServerThread server(server::ServerOptions{});
  client::Client c(client_options(server.port()));
  c.set("present", "1");
  try {
    c.wait({"present", "absent"}, 50ms);
    FAIL() << "wait should have timed out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 still missing: absent"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.stats().waiting_clients, 0u);
  // The connection is still in step: the next call works.
  EXPECT_EQ(c.get("present"), "1");
}

TEST(ServerTest, BadFrameClosesOnlyThatConnection) {
  server::ServerThread server(server::ServerOptions{});
  client::Client good(client_options(server.port()));
  good.set("k", "v");
  RawSocket bad(server.port());
  bad.send(unhex("ff 00 00"));
  bool eof = false;
  EXPECT_EQ(bad.read_until_eof(&eof), "");
  EXPECT_TRUE(eof);
  EXPECT_EQ(good.get("k"), "v");
}

TEST(ServerTest, OversizedKeyAndNonNumericAddAreRejected) {
  server::ServerOptions opts;
  opts.limits.max_key_bytes = 64;
  server::ServerThread server(opts);
  {
    RawSocket raw(server.port());
    raw.send(unhex("02 4100000000000000"));  // GET with a 65-byte key
    bool eof = false;
    raw.read_until_eof(&eof);
    EXPECT_TRUE(eof);
  }
  client::Client c(client_options(server.port()));
  c.set("text", "abc");
  EXPECT_THROW(c.add("text", 1), ConnectionError);
  // The client reconnects on the next call and the value is untouched.
  EXPECT_EQ(c.get("text"), "abc");
}

TEST(ServerTest, DisconnectMidWaitAndMidRequestLeaveNoState) {
  server::ServerThread server(server::ServerOptions{});
  {
    RawSocket raw(server.port());
    raw.send(unhex("05 0100000000000000 0100000000000000 6b"));  // WAIT k
    ASSERT_TRUE(eventually([&] { return server.stats().waiting_clients == 1; }));
  }
  EXPECT_TRUE(eventually([&] { return server.stats().waiting_clients == 0; }));
  {
    RawSocket raw(server.port());
    raw.send(unhex("00 0100000000000000 6b 0010000000000000 78"));  // SET k with 4 KiB promised, 1 sent
  }
  EXPECT_TRUE(eventually([&] { return server.stats().connections == 0; }));
  client::Client c(client_options(server.port()));
  EXPECT_FALSE(c.check({"k"}));
}

TEST(ServerTest, ManyClientThreadsKeepCountersExact) {
  server::ServerThread server(server::ServerOptions{});
  constexpr int kThreads = 32, kAdds = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      client::Client c(client_options(server.port()));
      for (int i = 0; i < kAdds; ++i) c.add("counter", 1);
      c.add("done", 1);
      c.wait({"all-done"});
    });
  }
  client::Client main_client(client_options(server.port()));
  while (main_client.add("done", 0) < kThreads) main_client.wait({"done"});
  main_client.set("all-done", "1");
  for (auto& t : threads) t.join();
  EXPECT_EQ(main_client.add("counter", 0), kThreads * kAdds);
}

// Woken, the store lets the threads waiting for its CPU run first (once per wake-up), unless that
// is turned off; either way every request is served, in order.
TEST(ServerTest, EveryWakeUpCedesTheCpuOnceUnlessTurnedOff) {
  for (const bool cede : {true, false}) {
    server::ServerOptions o;
    o.cede_when_busy = cede;
    server::ServerThread server(o);
    constexpr int kThreads = 16, kAdds = 50;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        client::Client c(client_options(server.port()));
        for (int i = 0; i < kAdds; ++i) c.add("shared", 1);
      });
    }
    for (auto& t : threads) t.join();
    client::Client check(client_options(server.port()));
    EXPECT_EQ(check.add("shared", 0), kThreads * kAdds);
    const server::ServerStats st = server.stats();
    // Each client sends its 50 requests one after another: each needs a turn of its own.
    EXPECT_GE(st.turns, static_cast<uint64_t>(kAdds));
    if (cede) {
      EXPECT_GT(st.ceded_turns, 0u);
      EXPECT_LE(st.ceded_turns, st.turns);
    } else {
      EXPECT_EQ(st.ceded_turns, 0u);
    }
  }
}

TEST(ServerTest, ClientWithoutReconnectReportsTheLostStore) {
  auto server = std::make_unique<server::ServerThread>(server::ServerOptions{});
  client::ClientOptions o = client_options(server->port());
  o.reconnect = false;
  client::Client c(o);
  c.set("k", "v");
  server.reset();
  EXPECT_THROW(c.get("k"), ConnectionError);
  try {
    c.get("k");
    FAIL() << "expected ConnectionError";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("was lost"), std::string::npos) << e.what();
  }
}

TEST(ServerTest, ConnectToClosedPortTimesOutNamingAttempts) {
  uint16_t port;
  {
    server::ServerThread server(server::ServerOptions{});
    port = server.port();
  }
  client::ClientOptions o = client_options(port);
  o.connect_timeout = 200ms;
  try {
    client::Client c(o);
    FAIL() << "connect should fail";
  } catch (const TimeoutError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("connect to store 127.0.0.1:" + std::to_string(port) + " timed out"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Connection refused"), std::string::npos) << msg;
  }
}

// VALIDATE with PyTorch's magic and a PING of nonce 42: the first bytes a c10d client sends, and
// the four bytes of the nonce back when it is served.
std::string validate_and_ping() {
  std::string out;
  core::put_u8(out, 0);
  core::put_u32(out, core::kValidateMagic);
  core::put_u8(out, 13);
  core::put_u32(out, 42);
  return out;
}

server::ServerOptions only_loopback(std::chrono::milliseconds grace) {
  server::ServerOptions o;
  o.allowed_peers = std::vector<std::string>{};  // loopback alone, until allow_peers names more
  o.admission_grace = grace;
  return o;
}

// A node can learn that it belongs to the job (a round, a quorum) before the store's host does:
// its workers' connections wait, unread, for the host to name it, and are then served.
TEST(ServerTest, AConnectionFromAnAddressNotAllowedYetIsHeldUnreadAndServedOnceItIsAllowed) {
  server::ServerThread server(only_loopback(60s));
  test::RawSocket early(server.port(), "127.0.0.1", "127.0.0.2");
  ASSERT_TRUE(early.send(validate_and_ping()));
  ASSERT_TRUE(eventually([&] { return server.stats().held_not_allowed == 1; })) << "the connection was not held";
  EXPECT_EQ(early.recv_exact(4, 100ms), "") << "a held connection is never read";
  server.allow_peers({"127.0.0.2"});
  EXPECT_EQ(early.recv_exact(4), std::string("\x2a\0\0\0", 4)) << "served once its address is allowed";
  const server::ServerStats st = server.stats();
  EXPECT_EQ(st.held_not_allowed, 0u);
  EXPECT_EQ(st.admitted_late, 1u);
  EXPECT_EQ(st.refused_not_allowed, 0u);
}

TEST(ServerTest, AStrangerIsResetUnreadOnceItsGraceIsOver) {
  server::ServerThread server(only_loopback(200ms));
  test::RawSocket stranger(server.port(), "127.0.0.1", "127.0.0.9");
  ASSERT_TRUE(stranger.send(validate_and_ping()));
  std::string got;
  EXPECT_TRUE(stranger.read_until_eof(&got, 30s)) << "the stranger is closed";
  EXPECT_EQ(got, "");
  EXPECT_TRUE(eventually([&] { return server.stats().refused_not_allowed == 1; }));
  server.allow_peers({"127.0.0.9"});  // too late: nothing of it is left to admit
  EXPECT_EQ(server.stats().admitted_late, 0u);
}

TEST(ServerTest, StrangersBeyondTheHeldCapAreResetAtOnceAndAZeroGraceHoldsNone) {
  server::ServerOptions o = only_loopback(60s);
  o.max_held_not_allowed = 2;
  server::ServerThread server(o);
  std::vector<std::unique_ptr<test::RawSocket>> held;
  for (const char* from : {"127.0.0.3", "127.0.0.4"}) {
    held.push_back(std::make_unique<test::RawSocket>(server.port(), "127.0.0.1", from));
    ASSERT_TRUE(held.back()->send(validate_and_ping()));
  }
  ASSERT_TRUE(eventually([&] { return server.stats().held_not_allowed == 2; }));
  test::RawSocket third(server.port(), "127.0.0.1", "127.0.0.5");
  EXPECT_TRUE(third.read_until_eof(nullptr, 30s)) << "beyond the cap: closed without waiting for its grace";
  EXPECT_EQ(server.stats().held_not_allowed, 2u);
  EXPECT_EQ(server.stats().refused_not_allowed, 1u);
  server.allow_peers({"127.0.0.4"});
  EXPECT_EQ(held[1]->recv_exact(4).size(), 4u) << "the allowed one of the held is served";
  EXPECT_EQ(server.stats().held_not_allowed, 1u) << "the other is still held: a later list may name it";

  server::ServerThread no_grace(only_loopback(0ms));
  test::RawSocket at_once(no_grace.port(), "127.0.0.1", "127.0.0.6");
  EXPECT_TRUE(at_once.read_until_eof(nullptr, 30s));
  EXPECT_EQ(no_grace.stats().refused_not_allowed, 1u);
}

TEST(ServerTest, ServesIpv6Loopback) {
  server::ServerOptions opts;
  opts.host = "::1";
  std::unique_ptr<server::ServerThread> server;
  try {
    server = std::make_unique<server::ServerThread>(opts);
  } catch (const ConnectionError& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  client::ClientOptions o = client_options(server->port());
  o.host = "::1";
  client::Client c(o);
  c.set("v6", "yes");
  EXPECT_EQ(c.get("v6"), "yes");
}

TEST(ServerTest, SecondServerOnTheSamePortFailsWithAClearError) {
  server::ServerThread first(server::ServerOptions{});
  server::ServerOptions opts;
  opts.port = first.port();
  try {
    server::ServerThread second(opts);
    FAIL() << "bind should fail";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(first.port())),
              std::string::npos)
        << e.what();
  }
}

// The server's end of an accepted connection, found among this process's descriptors: a connected
// socket whose local port is the server's.
int server_side_socket(uint16_t port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    int listening = 0;
    socklen_t optlen = sizeof listening;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    if (addr.ss_family != AF_INET) continue;
    if (ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port) != port) continue;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || listening) continue;
    return fd;
  }
  return -1;
}

TEST(ServerTest, AcceptedConnectionsHaveTcpKeepaliveSoDeadPeersAreReclaimed) {
  server::ServerThread server(server::ServerOptions{});
  client::Client c(client_options(server.port()));
  c.ping();
  const int fd = server_side_socket(server.port());
  ASSERT_GE(fd, 0);
  int on = 0, idle = 0, probes = 0;
  socklen_t len = sizeof on;
  ASSERT_EQ(::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &len), 0);
  ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &len);
  ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, &len);
  EXPECT_EQ(on, 1);
  EXPECT_EQ(idle, 60);
  EXPECT_EQ(probes, 6);
  EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "a launcher's workers must not inherit it";
}

// A set() returns once its bytes are written; a request that another connection sends afterwards
// must see it (the server reads every ready socket before applying anything).
TEST(ServerTest, SetIsVisibleToTheNextRequestOfAnotherConnection) {
  server::ServerThread server(server::ServerOptions{});
  client::Client a(client_options(server.port())), b(client_options(server.port()));
  int stale = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::string key = "k" + std::to_string(i);
    a.set(key, "v");
    if (b.num_keys() != 1) ++stale;
    if (b.compare_set(key, "v", "w") != "w") ++stale;
    if (!b.delete_key(key)) ++stale;
  }
  EXPECT_EQ(stale, 0);
}

}  // namespace
}  // namespace ddprun::rdzv
