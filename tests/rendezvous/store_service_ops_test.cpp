// ddprun-rendezvous as an operator runs it: its addresses in its log, its metrics and pages under
// a flood and a hostile Host field, the lines its peers can make it log, its request deadline,
// and its flags. Each test runs the daemon in its own process (store_service_test.cpp: its limits).
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "rendezvous/client/client.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/http.hpp"
#include "tests/support/raw_socket.hpp"
#include "tests/support/store_client.hpp"
#include "tests/support/store_frames.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

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

// Before: every connection closed for a bad request, or cut off in the middle of one, was a WARN
// line of its own: a peer looping connect-send-close wrote 7.5 MB of them in 5 s. Now the first of
// each reason from an address in a window is logged, and the others counted.
TEST(StoreServiceTest, ConnectionsClosedForWhatTheirPeerSentAreLoggedOncePerAddressAndCounted) {
  DaemonOptions o;
  o.args = {"--metrics-port", "0"};
  Daemon d(DAEMON_BIN, o);
  const uint16_t metrics_port = d.metrics_port();
  ASSERT_NE(metrics_port, 0) << d.log();
  for (int i = 0; i < 200; ++i) {
    RawSocket bad(d.port());
    bad.send(std::string("\xff\x00", 2));
    ASSERT_TRUE(bad.read_until_eof(nullptr, 10s));
    RawSocket cut(d.port());
    cut.send(v2_hello() + v2_set("k", "v").substr(0, 3));
    cut.close();
  }
  // Every cut connection is seen closed before the daemon stops (else it would end as a shutdown).
  const std::string cut_series = "ddprun_store_connections_closed_total{reason=\"peer_closed\"}";
  EXPECT_TRUE(test::wait_until([&] { return sample(http_get(metrics_port, "/metrics").body, cut_series) >= 200; }, 30s))
      << d.log().substr(0, 4000);
  expect_serving(d);
  d.stop(SIGTERM);
  EXPECT_EQ(d.log_count("bad request"), 1u) << d.log().substr(0, 4000);
  EXPECT_EQ(d.log_count("disconnected mid-request"), 1u) << d.log().substr(0, 4000);
  // The counts of what was not logged come out at the end of their window, or at shutdown.
  EXPECT_NE(d.log().find("199 more connections from 127.0.0.1 closed (bad_request) in the last"), std::string::npos)
      << d.log().substr(0, 4000);
  EXPECT_NE(d.log().find("199 more connections from 127.0.0.1 closed (peer_closed) in the last"), std::string::npos)
      << d.log().substr(0, 4000);
}

// Before: a request that never arrived whole was held for as long as its peer liked (ten unfinished
// 56 MiB MULTI_SETs held 560 MiB of an open daemon, forever). Now it has --request-timeout from the
// first of its bytes that waits for the rest; a client that goes on sending requests is never
// taken for one.
TEST(StoreServiceTest, ARequestThatDoesNotArriveWholeInTimeIsClosed) {
  DaemonOptions o;
  o.args = {"--request-timeout", "1"};
  Daemon d(DAEMON_BIN, o);
  RawSocket partial(d.port());
  ASSERT_TRUE(partial.send(v2_hello() + v2_set("k", std::string(1 << 20, 'v')).substr(0, 4096)));
  std::string got;
  EXPECT_TRUE(partial.read_until_eof(&got, 20s)) << d.log();
  EXPECT_NE(d.log_with("(--request-timeout)").find("incomplete SET request"), std::string::npos) << d.log();
  rdzv::client::Client c(test::store_client(d.port()));
  // Busy for longer than the deadline, a request at a time: never closed.
  const auto until = std::chrono::steady_clock::now() + 2500ms;
  for (int i = 0; std::chrono::steady_clock::now() < until; ++i) c.set("busy", std::to_string(i));
  c.ping();
  expect_serving(d);
}

// Every HTTP answer forbids sniffing, the 404 that repeats the job id it was asked for among them
// (a browser must never run it as a page); an empty Host field is refused like a foreign name.
TEST(StoreServiceTest, EveryHttpAnswerSaysNosniffAndAnEmptyHostIsRefused) {
  DaemonOptions o;
  o.args = {"--metrics-port", "0"};
  Daemon d(DAEMON_BIN, o);
  const uint16_t metrics_port = d.metrics_port();
  ASSERT_NE(metrics_port, 0) << d.log();
  const std::string script = "%3Cscript%3Ealert(1)%3C/script%3E";
  for (const std::string& path : {std::string("/metrics"), std::string("/ui"), std::string("/api/jobs"),
                                  "/api/job?job=" + script, std::string("/nope")}) {
    const HttpAnswer a = http_get(metrics_port, path);
    ASSERT_NE(a.status, 0) << path << ": no answer";
    const std::string header = a.whole.substr(0, a.whole.find("\r\n\r\n"));
    EXPECT_NE(header.find("\r\nX-Content-Type-Options: nosniff"), std::string::npos) << path << "\n" << header;
  }
  {
    RawSocket s(metrics_port);
    s.send("POST /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
    std::string whole;
    s.read_until_eof(&whole, 10s);
    EXPECT_EQ(whole.rfind("HTTP/1.1 405", 0), 0u) << whole;
    EXPECT_NE(whole.find("\r\nX-Content-Type-Options: nosniff"), std::string::npos) << whole;
  }
  EXPECT_EQ(http_get_host(metrics_port, "/api/jobs", "").status, 400);
  EXPECT_EQ(http_get_host(metrics_port, "/api/jobs", "localhost").status, 200);
  EXPECT_EQ(http_get_host(metrics_port, "/api/jobs", std::nullopt).status, 200) << "HTTP/1.0, no Host field";
  expect_serving(d);
}

// A flood of scrapes from one address: past its burst, it is answered 429 with how long to wait
// (Retry-After, whole seconds). Every loopback address is this host, one peer: before, a flood that
// went from 127.0.0.2 on to 127.0.0.3 (16 million of them) started afresh at each.
TEST(StoreServiceTest, AFloodOfScrapesFromOnePeerIsAnswered429WithRetryAfter) {
  DaemonOptions o;
  o.args = {"--metrics-port", "0"};
  Daemon d(DAEMON_BIN, o);
  const uint16_t metrics_port = d.metrics_port();
  ASSERT_NE(metrics_port, 0) << d.log();
  auto get_from = [&](const char* source) {
    RawSocket s(metrics_port, "127.0.0.1", source);
    s.send("GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    std::string whole;
    s.read_until_eof(&whole, 10s);
    return whole;
  };
  std::string limited;
  for (int i = 0; i < 500 && limited.empty(); ++i) {
    const std::string answer = get_from("127.0.0.2");
    if (answer.rfind("HTTP/1.1 429", 0) == 0) limited = answer;
    else ASSERT_EQ(answer.rfind("HTTP/1.1 200 OK", 0), 0u) << answer;
  }
  ASSERT_FALSE(limited.empty()) << "500 scrapes from one address, none refused";
  const size_t at = limited.find("\r\nRetry-After: ");
  ASSERT_NE(at, std::string::npos) << limited;
  EXPECT_GE(std::stoi(limited.substr(at + 15)), 1) << limited;
  EXPECT_EQ(get_from("127.0.0.3").rfind("HTTP/1.1 429", 0), 0u) << "another loopback address is the same peer";
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
