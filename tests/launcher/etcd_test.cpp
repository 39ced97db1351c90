// Rendezvous on a real etcd (Debian's etcd-server 3.4), one member or three: the etcd v3 client
// (values, transactions, leases, watches that survive a member's death), and ddprun jobs with
// --rdzv_backend etcd: static and elastic with real PyTorch gloo workers, two jobs at once, a job
// id run twice, a SIGKILLed node, an etcd member killed mid-job, etcd unreachable, a secured etcd
// (user and password, TLS).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "launcher/rendezvous/etcd/etcd_client.hpp"
#include "tests/support/etcd_cluster.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/health.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/job_node.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
namespace etcd = launcher::rendezvous::etcd;

#define REQUIRE_ETCD() \
  if (!have_etcd()) GTEST_FAIL() << "etcd-server and etcd-client are not installed: run scripts/install_deps.sh"

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// One node of a job on etcd: ddprun with `nproc` workers of `worker`.
// `conf`: more --rdzv_conf settings; `flags`: more flags.
std::unique_ptr<Subprocess> node(const std::string& endpoints, const std::string& id, const std::string& nnodes, int n,
                                 std::vector<std::string> worker, const std::string& conf = "",
                                 std::vector<std::string> flags = {}, int health_port = 0) {
  std::map<std::string, std::string> env{{"OMP_NUM_THREADS", "1"}, {"PYTHON_EXEC", TORCH_PYTHON}};
  if (health_port != 0) env.merge(health_env(health_port));
  return JobNode(n)
      .nnodes(nnodes)
      .without_rank()
      .meet(at_etcd(endpoints, id))
      .conf("join_timeout=60,last_call_timeout=2,lease_ttl=3" + (conf.empty() ? "" : "," + conf))
      .flags(flags)
      .env(env)
      .start(worker);
}

std::vector<std::string> gloo_worker() { return {GLOO_WORKER_PY}; }
std::vector<std::string> test_worker(std::vector<std::string> args) {
  args.insert(args.begin(), TEST_WORKER_BIN);
  return args;
}

// --- the client ---------------------------------------------------------------------------------

TEST(EtcdClientTest, EncodingsAndEndpoints) {
  for (const std::string& s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    EXPECT_EQ(etcd::base64_decode(etcd::base64_encode(s)), s);
  }
  EXPECT_EQ(etcd::base64_encode("foo"), "Zm9v");
  EXPECT_THROW(etcd::base64_decode("Zm9"), ProtocolError);
  EXPECT_EQ(etcd::prefix_end("/a/"), "/a0");
  EXPECT_EQ(etcd::prefix_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(etcd::parse_endpoint("10.0.0.1:2379").text, "http://10.0.0.1:2379");
  EXPECT_EQ(etcd::parse_endpoint("https://[::1]:2380/").text, "https://[::1]:2380");
  EXPECT_EQ(etcd::parse_endpoint("etcd-0").text, "http://etcd-0:2379");
  EXPECT_TRUE(etcd::parse_endpoint("https://e:1").tls);
  EXPECT_THROW(etcd::parse_endpoint("grpc://e:1"), ConfigError);
  EXPECT_THROW(etcd::parse_endpoint("e:99999"), ConfigError);
  EXPECT_THROW(etcd::parse_endpoint(":2379"), ConfigError);
  // A bare IPv6 address is a host, never split at its last colon (common/host_port.hpp).
  EXPECT_EQ(etcd::parse_endpoint("::1").text, "http://[::1]:2379");
  EXPECT_EQ(etcd::parse_endpoint("http://fe80::2").host, "fe80::2");
  EXPECT_EQ(etcd::parse_endpoint("[fe80::2]:2380").port, "2380");
}

TEST(EtcdClientTest, TransactionsLeasesAndAWatchThatOutlivesItsMember) {
  REQUIRE_ETCD();
  EtcdCluster cluster(3);
  etcd::Options o;
  o.endpoints = {cluster.endpoint(0), cluster.endpoint(1), cluster.endpoint(2)};
  etcd::Client c(o);
  const auto d = etcd::Client::after(10s);
  EXPECT_EQ(c.create_or_get("/t/once", "first", 0, d), "first");
  EXPECT_EQ(c.create_or_get("/t/once", "second", 0, d), "first") << "a creation happens once";
  const int64_t lease = c.lease_grant(2s, d);
  c.put("/t/leased", "x", lease, d);
  EXPECT_GT(c.lease_keepalive(lease, d), 0);
  const etcd::RangeResult before = c.get_prefix("/t/", d);
  EXPECT_EQ(before.kvs.size(), 2u);
  etcd::Watch w(c, "/t/", etcd::prefix_end("/t/"), before.revision + 1);
  // The member the watch (and the client) talks to first dies; both carry on with the others.
  cluster.kill(0);
  c.put("/t/after", "y", 0, etcd::Client::after(15s));
  std::vector<etcd::WatchEvent> seen;
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < until && seen.size() < 2) {
    for (auto& e : w.next(500ms, until)) seen.push_back(e);
  }
  // The put, then the leased key's deletion when its lease expires (no renewal since).
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].type, etcd::WatchEvent::Type::Put);
  EXPECT_EQ(seen[0].kv.key, "/t/after");
  EXPECT_EQ(seen[1].type, etcd::WatchEvent::Type::Delete);
  EXPECT_EQ(seen[1].kv.key, "/t/leased");
  EXPECT_EQ(c.lease_keepalive(lease, etcd::Client::after(10s)), 0) << "an expired lease renews to 0";
}

// An HTTP server that answers every request with a web page, as a proxy's login page or another
// service on the wrong port would: 200 OK, text/html.
class WebPageServer {
 public:
  WebPageServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("WebPageServer: cannot listen");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~WebPageServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int answered() const { return answered_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string request;
      char buf[4096];
      for (;;) {  // the header, then as much body as it announces (etcd requests are small)
        pollfd q{c, POLLIN, 0};
        if (::poll(&q, 1, 1000) != 1) break;
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
        const auto end = request.find("\r\n\r\n");
        if (end == std::string::npos) continue;
        const auto cl = request.find("Content-Length: ");
        const size_t body = cl == std::string::npos ? 0 : std::stoul(request.substr(cl + 16));
        if (request.size() >= end + 4 + body) break;
      }
      const std::string page =
          "<html><head><title>Sign in</title></head><body>Please sign in to the proxy</body></html>";
      const std::string answer =
          "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: " + std::to_string(page.size()) +
          "\r\nConnection: close\r\n\r\n" + page;
      (void)::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      ::close(c);
      ++answered_;
    }
  }
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> answered_{0};
  std::thread thread_;
};

TEST(EtcdClientTest, AnEndpointThatAnswersAWebPageIsAClearErrorAtTheDeadline) {
  WebPageServer web;
  etcd::Options o;
  o.endpoints = {web.endpoint()};
  etcd::Client c(o);
  try {
    c.create_or_get("/t/k", "v", 0, etcd::Client::after(2s));
    ADD_FAILURE() << "a web page was taken for etcd's answer";
  } catch (const ConnectionError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("answered /v3/kv/txn with something other than etcd's JSON (is this etcd's client port?)"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("Please sign in to the proxy"), std::string::npos) << what;
  }
  EXPECT_GE(web.answered(), 2) << "tried again until the deadline";
}

// --- jobs ---------------------------------------------------------------------------------------

TEST(EtcdRendezvousTest, AnEndpointThatAnswersAWebPageEndsTheJoinWithWhatItSaid) {
  WebPageServer web;
  Subprocess p({DDPRUN_BIN, "--rdzv_backend", "etcd", "--rdzv_endpoint", web.endpoint(), "--nnodes", "2", "--rdzv_conf",
                "join_timeout=3", TEST_WORKER_BIN, "print", "1"});
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out);
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find("etcd could not be reached at http://" + web.endpoint() + " within the join timeout (3s)"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.err.find("something other than etcd's JSON (is this etcd's client port?): '<html><head><title>Sign in"),
            std::string::npos)
      << f.err;
  EXPECT_EQ(f.err.find("json.exception"), std::string::npos) << f.err;
}

TEST(EtcdRendezvousTest, AStaticJobOfRealPyTorchWorkersTrainsAndItsKeysAreGoneAfterwards) {
  REQUIRE_ETCD();
  if (::access(TORCH_PYTHON, X_OK) != 0) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  EtcdCluster cluster(1);
  auto n0 = node(cluster.endpoints(), "job-a", "2", 0, gloo_worker(), "", {"--nproc_per_node", "2"});
  auto n1 = node(cluster.endpoints(), "job-a", "2", 1, gloo_worker(), "", {"--nproc_per_node", "2"});
  const Finished f0 = n0->wait(180s), f1 = n1->wait(180s);
  ASSERT_EQ(f0.exit_code, 0) << f0.err;
  ASSERT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_EQ(count(f0.out + f1.out, " ok 10.0 attempt 0"), 4u) << f0.out << f1.out;  // 4 ranks: 1+2+3+4
  // Only the job's generation counter stays, and not for ever: it is on a lease of its own.
  EXPECT_EQ(cluster.etcdctl("get --prefix /ddprun/job-a/ --keys-only"), "/ddprun/job-a/gen\n\n");
  const std::string counter = cluster.etcdctl("get /ddprun/job-a/gen -w json");
  const auto at = counter.find("\"lease\":");
  ASSERT_NE(at, std::string::npos) << counter;
  char hex[32];
  std::snprintf(hex, sizeof hex, "%llx", std::stoull(counter.substr(at + 8)));
  const std::string ttl = cluster.etcdctl(std::string("lease timetolive ") + hex);
  const auto granted = ttl.find("granted with TTL(");
  ASSERT_NE(granted, std::string::npos) << ttl;
  EXPECT_EQ(std::stol(ttl.substr(granted + 17)), 24 * 3600) << ttl;
}

TEST(EtcdRendezvousTest, AnElasticJobStartsWithTheNodesThereAfterTheLastCall) {
  REQUIRE_ETCD();
  if (::access(TORCH_PYTHON, X_OK) != 0) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  EtcdCluster cluster(1);
  // --nnodes 2:3 with two nodes: the round closes 2 s (last call) after the second joins.
  const int health0 = free_port();
  auto n0 = node(cluster.endpoints(), "elastic", "2:3", 0, gloo_worker(), "", {}, health0);
  // The first node has joined round 0 on etcd and waits for more (its health endpoint says so).
  ASSERT_TRUE(n0->wait_for(
      [&] {
        const Health h = health_of(health0);
        return h.phase == "joined" && h.round == 0;
      },
      60s))
      << n0->err();
  auto n1 = node(cluster.endpoints(), "elastic", "2:3", 1, gloo_worker());
  const Finished f0 = n0->wait(180s), f1 = n1->wait(180s);
  ASSERT_EQ(f0.exit_code, 0) << f0.err;
  ASSERT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_EQ(count(f0.out + f1.out, " ok 3.0 attempt 0"), 2u) << f0.out << f1.out;
}

TEST(EtcdRendezvousTest, TwoJobsAtOnceAndAJobIdRunTwice) {
  REQUIRE_ETCD();
  EtcdCluster cluster(1);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (const std::string id : {"x", "y"}) {
    for (int n = 0; n < 2; ++n) nodes.push_back(node(cluster.endpoints(), id, "2", n, test_worker({"print", "1"})));
  }
  for (auto& p : nodes) {
    const Finished f = p->wait(120s);
    EXPECT_EQ(f.exit_code, 0) << f.err;
  }
  // Job x again: a new generation, never the old run's keys.
  nodes.clear();
  for (int n = 0; n < 2; ++n) nodes.push_back(node(cluster.endpoints(), "x", "2", n, test_worker({"print", "1"})));
  for (auto& p : nodes) {
    const Finished f = p->wait(120s);
    EXPECT_EQ(f.exit_code, 0) << f.err;
    EXPECT_NE(f.err.find("(generation 2)"), std::string::npos) << f.err;
  }
}

TEST(EtcdRendezvousTest, ASigkilledNodeEndsAStaticJobWithAReportWhenItsLeaseExpires) {
  REQUIRE_ETCD();
  EtcdCluster cluster(1);
  Reports reports;
  auto n0 = node(cluster.endpoints(), "kill-static", "2", 0, test_worker({"sleep", "60"}), "", reports.flags(0));
  auto n1 = node(cluster.endpoints(), "kill-static", "2", 1, test_worker({"sleep", "60"}));
  ASSERT_TRUE(n1->wait_for_workers(1, 60s)) << n1->err();
  ASSERT_TRUE(n0->wait_for_workers(1, 60s)) << n0->err();
  n1->signal(SIGKILL);  // its workers die with it (the orphan guard); its lease lives 3 s
  const Finished f0 = n0->wait(60s);
  ASSERT_FALSE(f0.timed_out) << f0.err;
  EXPECT_EQ(f0.exit_code, 1) << f0.err;
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f0.err;
  EXPECT_EQ(r["outcome"], "node_lost");
  EXPECT_NE(r["message"].get<std::string>().find("lost its etcd lease"), std::string::npos) << r["message"];
}

TEST(EtcdRendezvousTest, ASigkilledNodeOfAnElasticJobLeavesTheSurvivorsToGoOn) {
  REQUIRE_ETCD();
  EtcdCluster cluster(1);
  const std::vector<std::string> worker = test_worker({"sleep", "8"});
  Reports reports;
  auto n0 = node(cluster.endpoints(), "kill-elastic", "1:2", 0, worker, "", reports.flags(0));
  auto n1 = node(cluster.endpoints(), "kill-elastic", "1:2", 1, worker);
  ASSERT_TRUE(n1->wait_for_workers(1, 60s)) << n1->err();
  ASSERT_TRUE(n0->wait_for_workers(1, 60s)) << n0->err();
  n1->signal(SIGKILL);
  const Finished f0 = n0->wait(90s);
  ASSERT_FALSE(f0.timed_out) << f0.err;
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  // The first round ended with the lost node; the survivor went on alone, no restart used.
  const auto r = reports.of(0);
  ASSERT_TRUE(r.is_object()) << f0.err;
  EXPECT_EQ(r["outcome"], "succeeded");
  EXPECT_EQ(r["restarts"], 0);
  ASSERT_EQ(r["attempts"].size(), 2u) << r.dump(2);
  EXPECT_EQ(r["attempts"][0]["outcome"], "node_lost") << r.dump(2);
  EXPECT_NE(r["attempts"][0]["message"].get<std::string>().find("lost its etcd lease"), std::string::npos) << r.dump(2);
  EXPECT_EQ(r["attempts"][1]["node_rank"], 0);
  EXPECT_EQ(r["attempts"][1]["nnodes"], 1);
}

// The hang watchdog across nodes with etcd as the channel: progress, the hang and every node's
// stacks travel as keys of the round.
TEST(EtcdRendezvousTest, AHangOnTwoNodesEndsBothWithOneReportThroughEtcd) {
  REQUIRE_ETCD();
  if (::access(TORCH_PYTHON, X_OK) != 0) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  EtcdCluster cluster(1);
  TempDir logs;  // (a hung run's directory is kept for its stacks: here, not under /tmp)
  auto n0 = node(cluster.endpoints(), "hung", "2", 0, {HANG_WORKER_PY, "collective", "1"}, "",
                 {"--node_rank", "0", "--hang_timeout", "5", "--log_dir", (logs.path / "node0").string()});
  auto n1 = node(cluster.endpoints(), "hung", "2", 1, {HANG_WORKER_PY, "collective", "1"}, "",
                 {"--node_rank", "1", "--hang_timeout", "5", "--log_dir", (logs.path / "node1").string()});
  const Finished f0 = n0->wait(120s), f1 = n1->wait(120s);
  ASSERT_FALSE(f0.timed_out || f1.timed_out) << f0.err << f1.err;
  EXPECT_EQ(f0.exit_code, 124) << f0.err;
  EXPECT_EQ(f1.exit_code, 124) << f1.err;
  EXPECT_EQ(count(f0.err + f1.err, "HUNG:"), 1u) << f0.err << f1.err;
  const std::string& report = f0.err.find("HUNG:") != std::string::npos ? f0.err : f1.err;
  EXPECT_NE(report.find("node 0, pid"), std::string::npos) << report;
  EXPECT_NE(report.find("node 1, pid"), std::string::npos) << report;
  EXPECT_NE(report.find("in stuck_in_user_code"), std::string::npos) << report;
  EXPECT_NE(report.find("in torch.distributed all_reduce"), std::string::npos) << report;
  EXPECT_EQ(cluster.etcdctl("get --prefix /ddprun/hung/ --keys-only"), "/ddprun/hung/gen\n\n");
}

TEST(EtcdRendezvousTest, AJobRidesOutTheDeathOfTheEtcdMemberItTalksTo) {
  REQUIRE_ETCD();
  EtcdCluster cluster(3);
  // Losing a member may cost an election (the leader was that member); on a busy 2-core machine
  // that has taken over 3 s, so the leases get the room a production TTL (10 s) gives.
  auto n0 = node(cluster.endpoints(), "failover", "2", 0, test_worker({"sleep", "6"}), "lease_ttl=8");
  auto n1 = node(cluster.endpoints(), "failover", "2", 1, test_worker({"sleep", "6"}), "lease_ttl=8");
  ASSERT_TRUE(n0->wait_for_workers(1, 60s)) << n0->err();
  ASSERT_TRUE(n1->wait_for_workers(1, 60s)) << n1->err();
  cluster.kill(0);  // the first endpoint: the one both agents talk to
  const Finished f0 = n0->wait(90s), f1 = n1->wait(90s);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
}

// Production etcds compact their history. A watch that resumes on another member after a
// compaction cannot replay what it missed: the agents read the round afresh and go on.
TEST(EtcdRendezvousTest, AWatchResumedPastACompactionReadsTheRoundAfreshAndTheJobGoesOn) {
  REQUIRE_ETCD();
  EtcdCluster cluster(3);
  // As above: the killed member may have been the leader, so the leases get an election's room.
  auto n0 = node(cluster.endpoints(), "compacted", "2", 0, test_worker({"sleep", "6"}), "lease_ttl=8");
  auto n1 = node(cluster.endpoints(), "compacted", "2", 1, test_worker({"sleep", "6"}), "lease_ttl=8");
  ASSERT_TRUE(n0->wait_for_workers(1, 60s)) << n0->err();
  ASSERT_TRUE(n1->wait_for_workers(1, 60s)) << n1->err();
  // Revisions the agents' watches never saw (another prefix), then compact up to the newest.
  std::string put;
  for (int i = 0; i < 3; ++i) put = cluster.etcdctl("put /elsewhere/k" + std::to_string(i) + " v -w json");
  const auto at = put.find("\"revision\":");
  ASSERT_NE(at, std::string::npos) << put;
  const long revision = std::stol(put.substr(at + 11));
  ASSERT_NE(cluster.etcdctl("compact " + std::to_string(revision)).find("compacted revision"), std::string::npos);
  cluster.kill(0);  // the watches' member: they resume elsewhere from a revision that is gone
  const Finished f0 = n0->wait(90s), f1 = n1->wait(90s);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_NE((f0.err + f1.err).find("etcd compacted its history past this watch"), std::string::npos)
      << f0.err << f1.err;
}

TEST(EtcdRendezvousTest, UnreachableEtcdIsAClearErrorWithinTheJoinTimeout) {
  const int dead1 = free_port(), dead2 = free_port();
  const std::string endpoints = "127.0.0.1:" + std::to_string(dead1) + ",127.0.0.1:" + std::to_string(dead2);
  Subprocess p({DDPRUN_BIN, "--rdzv_backend", "etcd", "--rdzv_endpoint", endpoints, "--nnodes", "2", "--rdzv_conf",
                "join_timeout=3", TEST_WORKER_BIN, "print", "1"});
  const Finished f = p.wait(60s);
  ASSERT_FALSE(f.timed_out);
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find("etcd could not be reached at http://127.0.0.1:" + std::to_string(dead1) +
                       ", http://127.0.0.1:" + std::to_string(dead2) + " within the join timeout (3s)"),
            std::string::npos)
      << f.err;
}

TEST(EtcdRendezvousTest, ASecuredEtcdWithAUserAPasswordAndTls) {
  REQUIRE_ETCD();
  TestCertificates certs;
  EtcdCluster cluster(1, &certs);
  ASSERT_NE(cluster.etcdctl("user add root:s3cret-pw").find("User root created"), std::string::npos);
  ASSERT_NE(cluster.etcdctl("auth enable").find("Authentication Enabled"), std::string::npos);
  TempDir dir;
  const std::string password = (dir.path / "pw").string();
  { std::ofstream(password) << "s3cret-pw\n"; }
  ::chmod(password.c_str(), 0600);
  const std::string conf = "etcd_user=root,etcd_password_file=" + password + ",etcd_ca_file=" + certs.ca;
  auto n0 = node(cluster.endpoints(), "secure", "2", 0, test_worker({"print", "1"}), conf);
  auto n1 = node(cluster.endpoints(), "secure", "2", 1, test_worker({"print", "1"}), conf);
  const Finished f0 = n0->wait(120s), f1 = n1->wait(120s);
  EXPECT_EQ(f0.exit_code, 0) << f0.err;
  EXPECT_EQ(f1.exit_code, 0) << f1.err;
  // Without credentials: refused, and told how to give them.
  auto anonymous = node(cluster.endpoints(), "secure", "2", 0, test_worker({"print", "1"}), "etcd_ca_file=" + certs.ca);
  const Finished fa = anonymous->wait(60s);
  EXPECT_EQ(fa.exit_code, 2) << fa.err;
  EXPECT_NE(fa.err.find("etcd_user"), std::string::npos) << fa.err;
  // A wrong password: refused, naming the settings to check.
  const std::string wrong = (dir.path / "wrong").string();
  { std::ofstream(wrong) << "not-the-password\n"; }
  ::chmod(wrong.c_str(), 0600);
  auto impostor = node(cluster.endpoints(), "secure", "2", 0, test_worker({"print", "1"}),
                       "etcd_user=root,etcd_password_file=" + wrong + ",etcd_ca_file=" + certs.ca);
  const Finished fw = impostor->wait(60s);
  EXPECT_EQ(fw.exit_code, 2) << fw.err;
  EXPECT_NE(fw.err.find("refused the user and password"), std::string::npos) << fw.err;
  // Without the CA: the server's certificate is not trusted, which no retry can change: exit at
  // once (well before the join timeout) naming the setting that fixes it.
  auto untrusted = node(cluster.endpoints(), "secure", "2", 0, test_worker({"print", "1"}), "join_timeout=120");
  const Finished fu = untrusted->wait(60s);
  EXPECT_EQ(fu.exit_code, 2) << fu.err;
  EXPECT_NE(fu.err.find("certificate verify failed"), std::string::npos) << fu.err;
  EXPECT_NE(fu.err.find("etcd_ca_file"), std::string::npos) << fu.err;
}

}  // namespace
}  // namespace ddprun::test
