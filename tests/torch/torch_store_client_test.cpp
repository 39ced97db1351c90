// LibTorch's own c10d::TCPStore client against the ddprun server: every operation it offers, many
// threads, timeouts. Built against LibTorch 1.13 (no handshake, a second idle callback connection)
// or 2.x (VALIDATE and PING, one connection), whichever this machine has.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/version.h>

#include "ddprun/worker/tcp_store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <thread>

#include "common/errors.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string str(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

c10::intrusive_ptr<c10d::TCPStore> torch_client(uint16_t port, std::optional<size_t> workers = std::nullopt) {
  c10d::TCPStoreOptions o = ddprun::worker::tcp_store_client_options(port, 10s);
  if (workers) o.numWorkers = *workers;
  o.waitWorkers = true;  // with numWorkers: ADD init/ on connect (both 1.13 and 2.x)
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

TEST(TorchStoreClientTest, EveryClientOperationWorks) {
  server::ServerThread server(server::ServerOptions{});
  auto store = torch_client(server.port(), 1);  // ADD init/ +1 on connect
  store->set("key", bytes("value"));
  EXPECT_EQ(str(store->get("key")), "value");
  EXPECT_EQ(store->add("counter", 5), 5);
  EXPECT_EQ(store->add("counter", -7), -2);
  EXPECT_EQ(str(store->compareSet("cas", bytes(""), bytes("first"))), "first");
  EXPECT_EQ(str(store->compareSet("cas", bytes("nope"), bytes("x"))), "first");
  EXPECT_EQ(str(store->compareSet("cas", bytes("first"), bytes("second"))), "second");
  EXPECT_EQ(str(store->compareSet("missing", bytes("exp"), bytes("x"))), "exp");
  EXPECT_TRUE(store->check({"key", "counter"}));
  EXPECT_FALSE(store->check({"key", "nothing"}));
  EXPECT_EQ(store->getNumKeys(), 4);  // init/, /key, /counter, /cas
  EXPECT_TRUE(store->deleteKey("key"));
  EXPECT_FALSE(store->deleteKey("key"));
  EXPECT_EQ(store->getNumKeys(), 3);
  store->wait({"counter", "cas"});
  std::vector<uint8_t> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
  store->set("big", big);
  EXPECT_EQ(store->get("big"), big);
}

TEST(TorchStoreClientTest, WaitTimesOutThenTheConnectionStillWorks) {
  server::ServerThread server(server::ServerOptions{});
  auto store = torch_client(server.port());
  EXPECT_THROW(store->wait({"never"}, 100ms), std::exception);
  // 1.13 sends no cancel: the server must drop the stale wait when the next request arrives.
  store->set("after", bytes("ok"));
  EXPECT_EQ(str(store->get("after")), "ok");
  auto other = torch_client(server.port());
  other->set("never", bytes("late"));
  EXPECT_EQ(store->add("n", 1), 1);  // would read a stray STOP_WAITING byte if one had been sent
  EXPECT_EQ(server.stats().waiting_clients, 0u);
}

TEST(TorchStoreClientTest, GetWaitsForAnotherClientsSet) {
  server::ServerThread server(server::ServerOptions{});
  auto reader = torch_client(server.port());
  auto writer = torch_client(server.port());
  auto got = std::async(std::launch::async, [&] { return str(reader->get("later")); });
  while (server.stats().waiting_clients == 0) std::this_thread::yield();
  writer->set("later", bytes("now"));
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(got.get(), "now");
}

TEST(TorchStoreClientTest, WatchKeyCallbacksFire) {
  server::ServerThread server(server::ServerOptions{});
  auto watcher = torch_client(server.port());
  auto writer = torch_client(server.port());
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::pair<std::string, std::string>> seen;
#if TORCH_VERSION_MAJOR >= 2
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no watchKey (deprecated in 2.x: it throws)";
#endif
  watcher->watchKey("w", [&](c10::optional<std::string> old_v, c10::optional<std::string> new_v) {
    std::lock_guard lock(m);
    seen.emplace_back(old_v.value_or("<none>"), new_v.value_or("<none>"));
    cv.notify_all();
  });
  writer->set("w", bytes("1"));
  std::unique_lock lock(m);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return !seen.empty(); }));
  EXPECT_EQ(seen[0].first, "<none>");
  EXPECT_EQ(seen[0].second, "1");
}

TEST(TorchStoreClientTest, PrefixStoreKeysAreIsolated) {
  server::ServerThread server(server::ServerOptions{});
  auto base = torch_client(server.port());
  c10d::PrefixStore attempt0("/worker/attempt_0", base);
  c10d::PrefixStore attempt1("/worker/attempt_1", base);
  attempt0.set("rank_0", bytes("a"));
  attempt1.set("rank_0", bytes("b"));
  EXPECT_EQ(str(attempt0.get("rank_0")), "a");
  EXPECT_EQ(str(attempt1.get("rank_0")), "b");
}

TEST(TorchStoreClientTest, ManyClientThreadsBarrierAndCount) {
  server::ServerThread server(server::ServerOptions{});
  constexpr int kClients = 48, kAdds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      try {
        auto store = torch_client(server.port(), kClients);
        for (int i = 0; i < kAdds; ++i) store->add("sum", t);
        store->set("rank_" + std::to_string(t), bytes(std::to_string(t)));
        if (store->add("arrived", 1) == kClients) store->set("go", bytes("1"));
        store->wait({"go"});
        EXPECT_EQ(str(store->get("rank_" + std::to_string((t + 1) % kClients))), std::to_string((t + 1) % kClients));
      } catch (const std::exception& e) {
        ++failures;
        ADD_FAILURE() << "client " << t << ": " << e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto check = torch_client(server.port());
  EXPECT_EQ(check->add("sum", 0), kAdds * (kClients * (kClients - 1) / 2));
}

}  // namespace
}  // namespace ddprun::rdzv

namespace ddprun::rdzv {
namespace {

// Our client against LibTorch's own server, in that LibTorch's dialect (1.13's, or 2.x's).
TEST(OurClientTest, TalksToLibTorchServer) {
  auto server = ddprun::worker::make_tcp_store_server("127.0.0.1", 0, 10s);
  client::ClientOptions co;
  co.port = server->getPort();
  co.timeout = 10s;
  co.dialect = TORCH_VERSION_MAJOR >= 2 ? core::Dialect::V2 : core::Dialect::Legacy;
  co.negotiate_auth = false;  // not a ddprun store: no secret handshake
  client::Client c(co);
  c.set("/k", "v");
  EXPECT_EQ(c.get("/k"), "v");
  EXPECT_EQ(str(server->get("k")), "v");  // PyTorch's client adds the "/" prefix
  EXPECT_EQ(c.add("/n", 3), 3);
  EXPECT_EQ(c.compare_set("/k", "v", "w"), "w");
  EXPECT_TRUE(c.check({"/k", "/n"}));
  EXPECT_TRUE(c.delete_key("/k"));
  EXPECT_EQ(c.num_keys(), 1);  // /n (no init/ counter: the server was made without a world size)
  EXPECT_THROW(c.wait({"/never"}, 50ms), TimeoutError);
  EXPECT_EQ(c.add("/n", 1), 4);  // reconnected after the timeout
#if TORCH_VERSION_MAJOR >= 2
  c.append("/k", "x");  // APPEND is 2.x's
  c.append("/k", "y");
  EXPECT_EQ(c.get("/k"), "xy");
#else
  EXPECT_THROW(c.append("/k", "x"), ProtocolError);  // 1.13's server has no APPEND
#endif
}

}  // namespace
}  // namespace ddprun::rdzv
