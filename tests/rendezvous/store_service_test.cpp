// ddprun-rendezvous as a long-running service, tried the way a hostile or merely buggy client
// would: each test runs the daemon in its own process and checks that it survives, stays within
// its memory bounds, and keeps serving everybody else.
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "common/errors.hpp"
#include "common/system.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/core/protocol.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/http.hpp"
#include "tests/support/raw_socket.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
using rdzv::core::put_bytes;
using rdzv::core::put_u32;
using rdzv::core::put_u64;
using rdzv::core::put_u8;

constexpr uint64_t kMiB = 1024 * 1024;

// 2.x frames (VALIDATE first), as PyTorch 2.x clients send them.
std::string v2_hello() {
  std::string s;
  put_u8(s, 0);
  put_u32(s, rdzv::core::kValidateMagic);
  return s;
}
std::string v2_set(const std::string& key, const std::string& value) {
  std::string s;
  put_u8(s, 1);
  put_bytes(s, key);
  put_bytes(s, value);
  return s;
}
std::string v2_get(const std::string& key) {
  std::string s;
  put_u8(s, 3);
  put_bytes(s, key);
  return s;
}
std::string v2_keys(uint8_t op, const std::vector<std::string>& keys) {
  std::string s;
  put_u8(s, op);
  put_u64(s, keys.size());
  for (const auto& k : keys) put_bytes(s, k);
  return s;
}
std::string v2_ping(uint32_t nonce) {
  std::string s;
  put_u8(s, 13);
  put_u32(s, nonce);
  return s;
}
constexpr uint8_t kV2Wait = 6, kV2MultiGet = 10, kV2CancelWait = 12;

rdzv::client::ClientOptions client_options(uint16_t port) {
  rdzv::client::ClientOptions o = test::store_client(port);
  o.timeout = 20s;
  return o;
}

// The daemon answers another client: a PING round trip and a read.
void expect_serving(Daemon& d) {
  ASSERT_TRUE(d.alive()) << "the daemon exited (status " << d.exit_status() << "):\n" << d.log();
  rdzv::client::Client c(client_options(d.port()));
  c.ping();
  c.set("still-serving", "yes");
  EXPECT_EQ(c.get("still-serving"), "yes");
}

// A 4 GiB address space: a daemon that tries to build a multi-gigabyte reply fails here instead
// of taking the test machine's memory. Tests that rely on it skip where the build's sanitizer
// makes the limit impossible.
#define SKIP_WITHOUT_ADDRESS_SPACE_LIMIT()                                  \
  if (!kAddressSpaceLimitWorks)                                             \
  GTEST_SKIP() << "RLIMIT_AS cannot bound a daemon built with a sanitizer " \
                  "(its shadow memory is reserved as address space)"
DaemonOptions bounded() {
  DaemonOptions o;
  o.address_space = rlim_t{4} << 30;
  return o;
}

TEST(StoreServiceTest, MultiGetWithAHugeReplyIsRefusedAndTheDaemonServesOn) {
  SKIP_WITHOUT_ADDRESS_SPACE_LIMIT();
  Daemon d(DAEMON_BIN, bounded());
  const std::string big(8 * kMiB, 'v');
  RawSocket evil(d.port());
  ASSERT_TRUE(evil.send(v2_hello() + v2_set("big", big)));
  // An 18 KB request asking for 2000 copies of the 8 MiB value: a 16 GiB reply.
  ASSERT_TRUE(evil.send(v2_keys(kV2MultiGet, std::vector<std::string>(2000, "big"))));
  std::string got;
  EXPECT_TRUE(evil.read_until_eof(&got, 30s)) << "the connection should be closed";
  EXPECT_EQ(got, "");
  expect_serving(d);
  rdzv::client::Client c(client_options(d.port()));
  EXPECT_EQ(c.get("big"), big) << "nothing stored may be lost";
  EXPECT_EQ(d.log_count("over the limit"), 1u) << d.log();
  EXPECT_LT(d.rss_kib(true), 256 * 1024u) << "peak RSS in KiB";
}

TEST(StoreServiceTest, PipelinedGetsOfAHugeValueWaitForTheClientToRead) {
  SKIP_WITHOUT_ADDRESS_SPACE_LIMIT();
  Daemon d(DAEMON_BIN, bounded());
  const std::string big(8 * kMiB, 'p');
  RawSocket evil(d.port());
  ASSERT_TRUE(evil.send(v2_hello() + v2_set("big", big)));
  std::string gets;
  for (int i = 0; i < 2000; ++i) gets += v2_get("big");
  ASSERT_TRUE(evil.send(gets));  // 20 KB of requests, 16 GiB of replies, none read yet
  expect_serving(d);
  EXPECT_LT(d.rss_kib(true), 256 * 1024u) << "peak RSS in KiB";
  // The replies come as the client reads them, in order and intact.
  for (int i = 0; i < 3; ++i) {
    const std::string len = evil.recv_exact(8);
    ASSERT_EQ(len.size(), 8u);
    EXPECT_EQ(rdzv::core::load_u64(len.data()), big.size());
    EXPECT_EQ(evil.recv_exact(big.size(), 30s), big);
  }
  evil.close();
  expect_serving(d);
  EXPECT_LT(d.rss_kib(true), 256 * 1024u) << "peak RSS in KiB";
}

TEST(StoreServiceTest, WatchClientThatNeverReadsIsDisconnectedNotBuffered) {
  SKIP_WITHOUT_ADDRESS_SPACE_LIMIT();
  Daemon d(DAEMON_BIN, bounded());
  RawSocket watcher(d.port());
  std::string watch;  // 1.13 WATCH_KEY (legacy numbering: 7)
  put_u8(watch, 7);
  put_bytes(watch, "/w");
  ASSERT_TRUE(watcher.send(watch));
  ASSERT_EQ(watcher.recv_exact(1), std::string(1, '\x03'));  // KEY_CALLBACK_REGISTERED
  const uint64_t before = d.rss_kib();
  rdzv::client::Client setter(client_options(d.port()));
  for (int i = 0; i < 100; ++i) setter.set("/w", std::string(4 * kMiB, static_cast<char>('a' + i % 26)));
  setter.ping();  // every SET has been applied
  EXPECT_LT(d.rss_kib(), before + 200 * 1024) << "RSS in KiB grew with unread notifications";
  EXPECT_TRUE(watcher.read_until_eof(nullptr, 60s)) << "the watcher should be disconnected";
  EXPECT_EQ(d.log_count("not reading what it is sent"), 1u) << d.log();
  expect_serving(d);
}

TEST(StoreServiceTest, StoreWideLimitsRefuseTheRequestAndKeepWhatIsStored) {
  DaemonOptions o;
  o.args = {"--max-total-keys", "10", "--max-store-bytes", "4096"};
  Daemon d(DAEMON_BIN, o);
  {
    rdzv::client::Client c(client_options(d.port()));
    for (int i = 0; i < 10; ++i) c.set("k" + std::to_string(i), "value" + std::to_string(i));
    c.set("k11", "x");  // an 11th key: refused, and the connection closed
    EXPECT_THROW(c.num_keys(), ConnectionError);
  }
  rdzv::client::Client c(client_options(d.port()));
  EXPECT_EQ(c.num_keys(), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(c.get("k" + std::to_string(i)), "value" + std::to_string(i));
  EXPECT_FALSE(c.check({"k11"}));
  c.append("k0", std::string(5000, 'x'));  // past 4096 bytes: refused, k0 unchanged
  EXPECT_THROW(c.ping(), ConnectionError);
  EXPECT_EQ(c.get("k0"), "value0");
  c.delete_key("k9");
  c.multi_set({{"m1", "1"}, {"m2", "2"}});  // 11 keys: none of them stored
  EXPECT_THROW(c.ping(), ConnectionError);
  EXPECT_FALSE(c.check({"m1"}));
  EXPECT_EQ(c.num_keys(), 9);
  EXPECT_EQ(d.log_count("(--max-total-keys)"), 2u) << d.log();
  EXPECT_EQ(d.log_count("(--max-store-bytes)"), 1u) << d.log();
  expect_serving(d);
}

TEST(StoreServiceTest, IdleAndHalfSentConnectionsCostUnder16KiBEach) {
  raise_open_file_limit();
  Daemon d(DAEMON_BIN);
  auto open_served = [&](std::vector<std::unique_ptr<RawSocket>>& into, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      auto s = std::make_unique<RawSocket>(d.port());
      ASSERT_TRUE(s->send(v2_hello() + v2_ping(7)));
      ASSERT_EQ(s->recv_exact(4).size(), 4u);
      into.push_back(std::move(s));
    }
  };
  {
    std::vector<std::unique_ptr<RawSocket>> warm;
    open_served(warm, 200);  // the allocator's and the kernel's first growth, not per-connection cost
  }
  expect_serving(d);
  const uint64_t base = d.rss_kib();
  constexpr size_t kEach = 2000;
  std::vector<std::unique_ptr<RawSocket>> conns;
  open_served(conns, 2 * kEach);
  std::string partial = v2_set("half-sent-key", "value");
  partial.resize(12);  // a SET cut off inside its key
  for (size_t i = kEach; i < 2 * kEach; ++i) ASSERT_TRUE(conns[i]->send(partial));
  // Every earlier byte is read before a later request is answered (see Server).
  expect_serving(d);
  const uint64_t after = d.rss_kib();
  const double per_connection = static_cast<double>(after - base) * 1024.0 / static_cast<double>(2 * kEach);
  RecordProperty("bytes_per_connection", static_cast<int>(per_connection));
  EXPECT_LT(per_connection, 16.0 * 1024) << "RSS " << base << " KiB -> " << after << " KiB for " << 2 * kEach
                                         << " connections";
}

TEST(StoreServiceTest, OutOfDescriptorsNewClientsAreToldAtOnceAndServedOnceSomeClose) {
  if (!kDescriptorExhaustionWorks) {
    GTEST_SKIP() << "UBSan's vptr check needs a descriptor of its own: run it without UBSan (DDPRUN_SANITIZE=address)";
  }
  DaemonOptions o;
  o.nofile = 64;
  Daemon d(DAEMON_BIN, o);
  std::vector<std::unique_ptr<RawSocket>> held;
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) {
    auto s = std::make_unique<RawSocket>(d.port());  // the kernel completes the handshake anyway
    if (!s->send(v2_hello() + v2_ping(1))) {
      refused = true;  // reset before the request was even sent: told at once
      break;
    }
    if (s->recv_exact(4, 10s).size() == 4) {
      held.push_back(std::move(s));
      continue;
    }
    // Not served: it must be told now (closed), not left waiting.
    EXPECT_TRUE(s->read_until_eof(nullptr, 1s)) << "a refused client must see its connection closed";
    refused = true;
  }
  ASSERT_TRUE(refused) << "64 descriptors should not serve 100 clients";
  for (int i = 0; i < 5; ++i) {
    RawSocket s(d.port());
    s.send(v2_hello() + v2_ping(2));
    EXPECT_TRUE(s.read_until_eof(nullptr, 10s)) << "refused client " << i << " was left waiting";
  }
  EXPECT_EQ(d.log_count("out of file descriptors"), 1u) << "one line per episode:\n" << d.log();
  held.resize(held.size() - 10);
  // Served again once descriptors are free (the server notices the closes in its next batch).
  bool served = false;
  for (int attempt = 0; attempt < 50 && !served; ++attempt) {
    RawSocket s(d.port());
    s.send(v2_hello() + v2_ping(3));
    served = s.recv_exact(4, 10s).size() == 4;
    // sleep override: the server learns of the closes asynchronously; give it a moment
    if (!served) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(served) << d.log();
  EXPECT_EQ(d.log_count("accepting connections again"), 1u) << d.log();
  ASSERT_TRUE(d.alive());
}

TEST(StoreServiceTest, WaitSentInSmallSlicesCostsAboutWhatItCostsSentAtOnce) {
  Daemon d(DAEMON_BIN);
  // 131072 one-byte keys: a 1.2 MB WAIT.
  std::vector<std::string> keys;
  for (int i = 0; i < 131072; ++i) keys.push_back(std::string(1, static_cast<char>('a' + i % 26)));
  const std::string wait = v2_keys(kV2Wait, keys);
  auto cancel = [](RawSocket& s) {
    std::string c;
    put_u8(c, kV2CancelWait);
    ASSERT_TRUE(s.send(c));
    ASSERT_EQ(s.recv_exact(1, 60s), std::string(1, '\x01'));  // WAIT_CANCELED: the WAIT was applied
  };
  const double start = d.cpu_seconds();
  {
    RawSocket whole(d.port());
    ASSERT_TRUE(whole.send(v2_hello() + wait));
    cancel(whole);
  }
  const double whole_cpu = d.cpu_seconds() - start;
  {
    RawSocket sliced(d.port());
    ASSERT_TRUE(sliced.send(v2_hello()));
    for (size_t off = 0; off < wait.size(); off += 200) {
      ASSERT_TRUE(sliced.send(wait.substr(off, 200)));
      // sleep override: pacing, so that the slices reach the server as separate segments
      std::this_thread::sleep_for(50us);
    }
    cancel(sliced);
  }
  const double sliced_cpu = d.cpu_seconds() - start - whole_cpu;
  RecordProperty("whole_cpu_ms", static_cast<int>(whole_cpu * 1000));
  RecordProperty("sliced_cpu_ms", static_cast<int>(sliced_cpu * 1000));
  // Linear decoding: the same work either way (plus a read per slice). Re-parsing from the start
  // on every read made this 1.4 s against 0.01 s.
  EXPECT_LT(sliced_cpu, 10 * whole_cpu + 0.3) << "whole " << whole_cpu << " s, sliced " << sliced_cpu << " s";
  expect_serving(d);
}

// GET `path` from the daemon's metrics port; returns the whole HTTP response.

// The value of the first sample whose line starts with `series` ("name{labels}"), or -1.
double sample(const std::string& text, const std::string& series) {
  const auto pos = text.find("\n" + series + " ");
  if (pos == std::string::npos) return -1;
  return std::stod(text.substr(pos + series.size() + 2));
}

// On an IPv6 address the daemon prints where it serves as [v6]:port, as every ddprun program writes
// an address (its metrics line said "::1:PORT", which no client can split).
TEST(StoreServiceTest, AnIpv6DaemonPrintsItsAddressesInBrackets) {
  DaemonOptions o;
  o.args = {"--host", "::1", "--metrics-port", "0"};
  std::unique_ptr<Daemon> d;
  try {
    d = std::make_unique<Daemon>(DAEMON_BIN, o);
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find("cannot listen on [::1]") != std::string::npos) {
      GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
    }
    throw;
  }
  // The line comes after the port file the daemon's start waits for: read once it is there.
  const std::string listening = "listening on [::1]:" + std::to_string(d->port());
  EXPECT_NE(d->log_with(listening).find(listening), std::string::npos) << d->log();
  EXPECT_EQ(d->metrics_line(), "metrics on [::1]:" + std::to_string(d->metrics_port())) << d->log();
}

// --no-cede: the daemon serves each wake-up at once (ServerOptions::cede_when_busy off): it counts
// its turns and cedes none.
TEST(StoreServiceTest, NoCedeServesEveryWakeUpAtOnce) {
  DaemonOptions o;
  o.args = {"--metrics-port", "0", "--no-cede"};
  Daemon d(DAEMON_BIN, o);
  rdzv::client::Client c(client_options(d.port()));
  for (int i = 0; i < 20; ++i) c.set("k" + std::to_string(i), "v");
  const std::string response = http_get(d.metrics_port(), "/metrics").whole;
  const std::string body = response.substr(response.find("\r\n\r\n") + 4);
  EXPECT_GT(sample(body, "ddprun_store_turns_total"), 0) << body;
  EXPECT_EQ(sample(body, "ddprun_store_ceded_turns_total"), 0) << body;
}

TEST(StoreServiceTest, MetricsEndpointPassesPromtoolAndCountsWhatHappened) {
  DaemonOptions o;
  o.args = {"--metrics-port", "0"};
  Daemon d(DAEMON_BIN, o);
  const uint16_t metrics_port = d.metrics_port();
  ASSERT_NE(metrics_port, 0) << d.log();

  rdzv::client::Client c(client_options(d.port()));
  for (int i = 0; i < 3; ++i) c.set("k" + std::to_string(i), "v");
  c.set("/ddprun/job/g1/r0/node/0", R"({"host":"h","nproc":1,"nnodes":1,"agent":"a"})");
  c.set("/ddprun/job/g1/r0/complete", "1");
  {
    RawSocket bad(d.port());
    bad.send(std::string("\xff\x00", 2));
    bad.read_until_eof();
  }
  RawSocket waiter(d.port());
  waiter.send(v2_hello() + v2_keys(kV2Wait, {"never"}));
  c.ping();  // the WAIT was read before this is answered

  const std::string response = http_get(metrics_port, "/metrics").whole;
  ASSERT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
  EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << response;
  const std::string body = response.substr(response.find("\r\n\r\n") + 4);
  EXPECT_EQ(sample(body, "ddprun_store_requests_total{op=\"SET\"}"), 5);
  EXPECT_EQ(sample(body, "ddprun_store_keys"), 5);
  EXPECT_EQ(sample(body, "ddprun_store_pending_waits"), 1);
  EXPECT_EQ(sample(body, "ddprun_store_connections"), 2);
  EXPECT_EQ(sample(body, "ddprun_store_connections_closed_total{reason=\"bad_request\"}"), 1);
  EXPECT_EQ(sample(body, "ddprun_store_jobs{state=\"running\"}"), 1);
  EXPECT_GT(sample(body, "ddprun_store_received_bytes_total"), 0);
  EXPECT_GT(sample(body, "ddprun_store_turns_total"), 0);
  EXPECT_GT(sample(body, "ddprun_store_ceded_turns_total"), 0);
  EXPECT_LE(sample(body, "ddprun_store_ceded_turns_total"), sample(body, "ddprun_store_turns_total"));
  EXPECT_GT(sample(body, "process_resident_memory_bytes"), 0);

  // Prometheus's own linter: valid exposition, no complaints.
  const Lint lint = promtool_check(body);
  ASSERT_NE(lint.exit_code, 127) << "promtool is missing (Debian's prometheus package; scripts/install_deps.sh)";
  EXPECT_EQ(lint.exit_code, 0) << lint.says;
  EXPECT_EQ(lint.says, "") << body;

  EXPECT_EQ(http_get(metrics_port, "/nope").status, 404);
  expect_serving(d);
}

// The daemon's command line: a malformed value exits 2 with a message naming the flag as written
// and what it expects; nothing is served.
TEST(StoreServiceTest, AMalformedFlagExitsTwoNamingItAndWhatItExpects) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--port", "70000"}, "--port: expected a port from 0 to 65535, got '70000'"},
      {{"--job-ttl", "-1"}, "--job-ttl: expected a number of seconds >= 0, got '-1'"},
      {{"--handshake_timeout=0"}, "--handshake_timeout: expected a number of seconds in (0, 3600], got '0'"},
      {{"--max-pending-handshakes", "0"},
       "--max-pending-handshakes: expected a whole number from 1 to 1048576, got '0'"},
      {{"--state-file="}, "--state-file: expected a path, got ''"},
      {{"--max-keys"}, "--max-keys needs a value"},
      {{"--bogus"}, "unknown option '--bogus'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv{DAEMON_BIN, "--port", "0"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    Subprocess p(argv);
    const Finished f = p.wait(30s);
    EXPECT_EQ(f.exit_code, 2) << c.args.front() << ": " << f.err;
    EXPECT_NE(f.err.find(c.says), std::string::npos) << "expected '" << c.says << "' in: " << f.err;
    EXPECT_EQ(f.out.find("listening on"), std::string::npos) << f.out;
  }
}

// Dashes and underscores spell the same flag (as ddprun's own flags): --max_key_bytes is
// --max-key-bytes.
TEST(StoreServiceTest, UnderscoresSpellTheSameFlags) {
  DaemonOptions options;
  options.args = {"--max_key_bytes", "64", "--job_ttl=5"};
  Daemon d(DAEMON_BIN, options);
  expect_serving(d);
  rdzv::client::Client c(client_options(d.port()));
  // SET has no reply: the refusal (the connection closed) shows at the next request.
  EXPECT_THROW(
      {
        c.set(std::string(65, 'k'), "v");
        c.ping();
      },
      std::exception)
      << "a 65-byte key is over --max_key_bytes 64";
  EXPECT_EQ(d.log_count("over the limit"), 1u) << d.log();
}

}  // namespace
}  // namespace ddprun::test
