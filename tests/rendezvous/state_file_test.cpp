// ddprun-rendezvous --state-file: ADD_ONCE, the state journal, a server restarted on its file, and
// clients that ride out the restart (real sockets on loopback, real files).
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/errors.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/core/kv_store.hpp"
#include "rendezvous/server/server.hpp"
#include "rendezvous/server/state_journal.hpp"
#include "tests/support/files.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;

TEST(AddOnceTest, ATokenSeenBeforeReturnsTheFirstResultAndAddsNothing) {
  core::KvStore store;
  EXPECT_EQ(store.add_once("c", 1, "t1"), 1);
  EXPECT_EQ(store.add_once("c", 1, "t2"), 2);
  EXPECT_EQ(store.add_once("c", 1, "t1"), 1);  // a retry of the first
  EXPECT_EQ(store.add("c", 0), 2);
}

TEST(AddOnceTest, OnlyTheLatestTokensAreRemembered) {
  core::KvStore store;
  store.add_once("c", 1, "first");
  for (size_t i = 0; i < core::KvStore::kOnceTokens; ++i) store.add_once("c", 1, "t" + std::to_string(i));
  const int64_t now = store.add("c", 0);
  EXPECT_EQ(store.add_once("c", 1, "first"), now + 1);  // forgotten: a new ADD
  EXPECT_EQ(store.add_once("c", 1, "t" + std::to_string(core::KvStore::kOnceTokens - 1)), now);
}

// A store journaled to `path` while `change` changes it, then dropped without an orderly shutdown:
// the file holds what a killed daemon leaves.
void journaled(const std::string& path, const std::function<void(core::KvStore&, server::StateJournal&)>& change) {
  core::KvStore store;
  server::StateJournal journal(path, store);
  store.set_observer(&journal);
  change(store, journal);
  store.set_observer(nullptr);
}

TEST(StateJournalTest, AStateFileInADirectoryThatDoesNotExistSaysToCreateIt) {
  test::TempDir dir;
  const std::string path = (dir.path / "missing" / "state").string();
  core::KvStore store;
  try {
    server::StateJournal journal(path, store);
    FAIL() << "a state file in a missing directory was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("mkdir -p " + (dir.path / "missing").string()), std::string::npos) << e.what();
  }
}

TEST(StateJournalTest, WhatWasStoredComesBackInANewStore) {
  test::TempDir dir;
  const std::string path = dir.str() + "/state";
  journaled(path, [](core::KvStore& store, server::StateJournal& journal) {
    store.set("a", "1");
    store.set("b", std::string("\0x\xff", 3));
    store.add("n", 41);
    store.add_once("n", 1, "tok");
    store.set("gone", "x");
    store.remove("gone");
    store.queue_push("q", "first");
    store.queue_push("q", "second");
    std::string popped;
    store.queue_pop("q", popped);
    store.append("a", "23");
    journal.flush();
  });
  core::KvStore again;
  server::StateJournal journal(path, again);
  EXPECT_EQ(journal.loaded().keys, 3u);
  EXPECT_EQ(journal.loaded().queues, 1u);
  EXPECT_EQ(journal.loaded().dropped_bytes, 0u);
  ASSERT_NE(again.get("a"), nullptr);
  EXPECT_EQ(*again.get("a"), "123");
  EXPECT_EQ(*again.get("b"), std::string("\0x\xff", 3));
  EXPECT_EQ(*again.get("n"), "42");
  EXPECT_EQ(again.get("gone"), nullptr);
  EXPECT_EQ(again.queue_len("q"), 1);
  EXPECT_EQ(again.add_once("n", 1, "tok"), 42);  // the token came back too: a retry adds nothing
}

TEST(StateJournalTest, ATornLastRecordIsDroppedAndTheRestLoaded) {
  test::TempDir dir;
  const std::string path = dir.str() + "/state";
  journaled(path, [](core::KvStore& store, server::StateJournal& journal) {
    store.set("kept", "yes");
    journal.flush();
    store.set("torn", "a value long enough to cut in half");
    journal.flush();
  });
  const auto size = std::filesystem::file_size(path);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size - 10)), 0);  // died mid-write
  core::KvStore again;
  server::StateJournal journal(path, again);
  EXPECT_GT(journal.loaded().dropped_bytes, 0u);
  ASSERT_NE(again.get("kept"), nullptr);
  EXPECT_EQ(again.get("torn"), nullptr);
  // Rewritten as a snapshot: the next start loads cleanly.
  core::KvStore third;
  server::StateJournal reread(path, third);
  EXPECT_EQ(reread.loaded().dropped_bytes, 0u);
  EXPECT_NE(third.get("kept"), nullptr);
}

TEST(StateJournalTest, AFileThatIsNoStateFileIsRefusedWithItsPath) {
  test::TempDir dir;
  const std::string path = dir.str() + "/notes.txt";
  std::ofstream(path) << "my notes\n";
  core::KvStore store;
  try {
    server::StateJournal journal(path, store);
    FAIL() << "loaded a file that is no state file";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a ddprun-rendezvous state file"), std::string::npos) << e.what();
  }
  EXPECT_EQ(test::read_file(path), "my notes\n");  // left as it was
}

TEST(StateJournalTest, ChangesOutgrowingTheSnapshotAreNotKeptForever) {
  test::TempDir dir;
  const std::string path = dir.str() + "/state";
  core::KvStore store;
  server::StateJournal journal(path, store);
  store.set_observer(&journal);
  const std::string value(64 * 1024, 'v');
  for (int i = 0; i < 3000; ++i) {  // ~190 MiB of changes to one key
    store.set("hot", value + std::to_string(i));
    journal.flush();
  }
  EXPECT_LT(std::filesystem::file_size(path), uint64_t{80} << 20);
  store.set_observer(nullptr);
  core::KvStore again;
  server::StateJournal reread(path, again);
  EXPECT_EQ(*again.get("hot"), value + "2999");
}

server::ServerOptions durable_options(const std::string& state, uint16_t port = 0) {
  server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.log_lifecycle = false;
  o.state_file = state;
  return o;
}

client::ClientOptions client_options(uint16_t port, std::chrono::milliseconds tolerance) {
  client::ClientOptions o = test::store_client(port, 5s);
  o.outage_tolerance = tolerance;
  return o;
}

// A store that keeps its state (`first`, on `port`), whose state file is `state`.
class DurableServerTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  const std::string state = dir.str() + "/state";
  std::unique_ptr<server::ServerThread> first = std::make_unique<server::ServerThread>(durable_options(state));
  const uint16_t port = first->port();
};

TEST_F(DurableServerTest, ARestartedServerAnswersAsTheOneThatStopped) {
  {
    client::Client c(client_options(port, 0ms));
    c.set("/ddprun/job/g1/r0/node/0", "record");
    EXPECT_EQ(c.add("/ddprun/job/g1/r0/joined", 2), 2);
  }
  first.reset();
  server::ServerThread second(durable_options(state, port));
  client::Client c(client_options(port, 0ms));
  EXPECT_EQ(c.get("/ddprun/job/g1/r0/node/0"), "record");
  EXPECT_EQ(c.add("/ddprun/job/g1/r0/joined", 0), 2);
  const nlohmann::json info = nlohmann::json::parse(c.get(std::string(core::kStoreInfoKey)));
  EXPECT_TRUE(info.at("durable").get<bool>());
}

TEST_F(DurableServerTest, AClientRidesOutARestartAndAddsOnce) {
  client::Client c(client_options(port, 10s));
  ASSERT_TRUE(c.rides_out_outages());
  EXPECT_EQ(c.add("counter", 1), 1);
  c.set("written", "before");
  first.reset();  // the store goes away with the client connected
  std::unique_ptr<server::ServerThread> second;
  auto restart = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(700ms);  // sleep override: the store's downtime
    second = std::make_unique<server::ServerThread>(durable_options(state, port));
  });
  // Issued while the store is down: it waits for the store to come back, then goes through.
  EXPECT_EQ(c.add("counter", 1), 2);
  restart.get();
  EXPECT_EQ(c.get("written"), "before");
  EXPECT_EQ(c.reconnects(), 1u);
  client::Client other(client_options(port, 0ms));
  EXPECT_EQ(other.add("counter", 0), 2);
}

TEST_F(DurableServerTest, AWaitPendingAcrossTheRestartEndsWhenTheKeyArrives) {
  client::Client waiter(client_options(port, 10s));
  auto waited = std::async(std::launch::async, [&] { waiter.wait({"late"}, 20s); });
  // The WAIT has reached the first store: it holds a client that waits.
  ASSERT_TRUE(test::wait_until([&] { return first->stats().waiting_clients == 1; }, 10s));
  first.reset();
  server::ServerThread second(durable_options(state, port));
  client::Client setter(client_options(port, 0ms));
  setter.set("late", "1");
  EXPECT_EQ(waited.wait_for(10s), std::future_status::ready);
  waited.get();
}

TEST_F(DurableServerTest, AStoreThatComesBackWithoutItsStateFailsTheCallAndSaysSo) {
  client::Client c(client_options(port, 10s));
  c.set("k", "v");
  first.reset();
  server::ServerThread memory_only(durable_options("", port));
  try {
    c.get("k", 2s);
    FAIL() << "a store that lost its state was taken for the one that kept it";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("came back without the state"), std::string::npos) << e.what();
  }
}

TEST(StoreStateTest, AStoreThatKeepsNoStateIsNotWaitedFor) {
  auto first = std::make_unique<server::ServerThread>(durable_options(""));
  const uint16_t port = first->port();
  client::Client c(client_options(port, 10s));
  EXPECT_FALSE(c.rides_out_outages());
  first.reset();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(c.add("k", 1), std::exception);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 8s);  // not the 10 s tolerance
}

TEST(StoreStateTest, AJobScopedClientReadsTheStoreInfoButCannotWriteIt) {
  test::TempDir dir;
  server::ServerOptions o = durable_options(dir.str() + "/state");
  core::Token cluster;
  cluster.cluster_secret = "0123456789abcdef0123456789abcdef";
  o.secret = core::store_secret(cluster);
  server::ServerThread server(o);
  client::ClientOptions co = client_options(server.port(), 10s);
  co.credentials = core::Credentials{"job", core::job_key(cluster.cluster_secret, "job")};
  client::Client c(co);
  EXPECT_TRUE(c.rides_out_outages());
  client::Client writer(co);
  EXPECT_THROW(
      {
        writer.set(std::string(core::kStoreInfoKey), "{}");
        writer.check({"/ddprun/job/x"});
      },
      ConnectionError);
}

}  // namespace
}  // namespace ddprun::rdzv
