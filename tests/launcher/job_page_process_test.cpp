// The job pages of a real ddprun (--http_port) and daemon (--metrics-port), read over HTTP as a
// person's browser reads them: what /api/job says while a job of one node fails, stops its
// workers, restarts and fails again; and which names (Host fields) the pages answer under: this
// host's and loopback's, never another site's that resolves here (DNS rebinding), unless listed.
#include <gtest/gtest.h>

#include <netdb.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/daemon.hpp"
#include "tests/support/ddprun_bin.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/http.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// /api/job of the ddprun on `port`; a discarded value when it does not answer with one.
json job_view(uint16_t port) {
  try {
    const HttpAnswer a = http_get(port, "/api/job");
    if (a.status != 200) return json(json::value_t::discarded);
    return json::parse(a.body, nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception&) {
    return json(json::value_t::discarded);  // not listening (yet, or any more)
  }
}

int root_cause_rank(const json& view) {
  const json& r = view["report"];
  return r.is_object() && r["root_cause"].is_object() ? r["root_cause"]["rank"].get<int>() : -1;
}

// Rank 1 fails (exit code 3): at once in the first attempt, and in the second once `go` exists.
// Rank 0 ignores SIGTERM, so each stop takes ddprun's whole --shutdown_timeout.
constexpr const char* kFailingJob = R"(
if [ "$RANK" = 1 ]; then
  if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ]; then while [ ! -e "$1/go" ]; do sleep 0.05; done; fi
  echo "rank 1 fails" >&2
  exit 3
fi
trap '' TERM
exec sleep 600
)";

TEST(JobPageProcessTest, AFailureOfAJobOfOneNodeIsShownWhileItsWorkersStopAndThroughTheRestart) {
  TempDir dir;
  const auto port = static_cast<uint16_t>(free_port());
  Subprocess p(ddprun({"--http_port", std::to_string(port), "--nproc_per_node", "2", "--max_restarts", "1",
                       "--shutdown_timeout", "5", "sh", "-c", kFailingJob, "job", dir.path.string()}));
  // The first failure: while rank 0 takes its grace, the page says the workers stop, and why.
  json seen;
  ASSERT_TRUE(p.wait_for(
      [&] {
        seen = job_view(port);
        return seen.is_object() && (seen["phase"]["name"] == "stopping" || seen["restarts"] != 0);
      },
      60s))
      << seen.dump(2);
  EXPECT_EQ(seen["restarts"], 0) << "the restart came and the page never said the workers stop";
  EXPECT_EQ(seen["phase"]["name"], "stopping") << seen.dump(2);
  EXPECT_NE(seen["phase"]["detail"].get<std::string>().find("rank 1"), std::string::npos) << seen.dump(2);
  EXPECT_EQ(root_cause_rank(seen), 1) << seen.dump(2);

  // The second attempt runs: the first one's failure is still the page's root cause.
  ASSERT_TRUE(p.wait_for(
      [&] {
        seen = job_view(port);
        return seen.is_object() && seen["restarts"] == 1 && seen["phase"]["name"] == "running" &&
               seen["workers_alive"] == 2;
      },
      60s))
      << seen.dump(2);
  EXPECT_EQ(root_cause_rank(seen), 1) << seen.dump(2);
  const auto first_failure = seen["report"]["root_cause"]["pid"];

  // The final failure: shown while the workers stop, before ddprun ends.
  std::ofstream(dir.path / "go") << "\n";
  ASSERT_TRUE(p.wait_for(
      [&] {
        seen = job_view(port);
        return !seen.is_object() || seen["phase"]["name"] != "running";
      },
      60s))
      << seen.dump(2);
  ASSERT_TRUE(seen.is_object()) << "ddprun ended and its page never showed the workers stopping";
  EXPECT_EQ(seen["phase"]["name"], "stopping") << seen.dump(2);
  EXPECT_EQ(root_cause_rank(seen), 1) << seen.dump(2);
  EXPECT_NE(seen["report"]["root_cause"]["pid"], first_failure) << seen.dump(2);
  const Finished f = p.wait(60s);
  EXPECT_EQ(f.exit_code, 3) << f.err;
}

std::string this_host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// This host's FQDN, as `hostname -f` says it (its canonical name).
std::string this_fqdn() {
  addrinfo hints{};
  hints.ai_flags = AI_CANONNAME;
  addrinfo* found = nullptr;
  std::string fqdn = this_host();
  if (::getaddrinfo(fqdn.c_str(), nullptr, &hints, &found) == 0 && found) {
    if (found->ai_canonname && *found->ai_canonname) fqdn = found->ai_canonname;
    ::freeaddrinfo(found);
  }
  return fqdn;
}

// The Host fields a browser on this host (or at the end of `ssh -L`) sends for `port`.
std::vector<std::string> own_hosts(uint16_t port) {
  const std::string p = std::to_string(port);
  return {"localhost:" + p,      "[::1]:" + p,          "127.0.0.1",     "127.0.0.1:" + p,
          this_host() + ":" + p, this_fqdn() + ":" + p, "localhost:9999"};  // ssh -L 9999:localhost:PORT
}

// ddprun's page under each name: this host's answer, another site's is refused and told how to
// allow it, a request naming no host (HTTP/1.0) is answered; --http_allowed_hosts adds names.
TEST(JobPageProcessTest, ThePageAnswersOnlyUnderThisHostsNamesAndTheListedOnes) {
  const auto port = static_cast<uint16_t>(free_port());
  Subprocess p(ddprun({"--http_port", std::to_string(port), "--nproc_per_node", "1", TEST_WORKER_BIN, "sleep", "120"}));
  ASSERT_TRUE(p.wait_for([&] { return job_view(port).is_object(); }, 60s));
  for (const char* path : {"/api/job", "/ui", "/hang_report"}) {
    const int ok = std::string(path) == "/hang_report" ? 404 : 200;  // (no hang: nothing to show)
    for (const std::string& host : own_hosts(port)) EXPECT_EQ(http_get_host(port, path, host).status, ok) << host;
    EXPECT_EQ(http_get_host(port, path, std::nullopt).status, ok) << "HTTP/1.0 without a Host field";
    const HttpAnswer refused = http_get_host(port, path, "attacker.example:" + std::to_string(port));
    EXPECT_EQ(refused.status, 403) << refused.whole;
    EXPECT_NE(refused.body.find("attacker.example"), std::string::npos) << refused.body;
    EXPECT_NE(refused.body.find("--http_allowed_hosts"), std::string::npos) << refused.body;
    EXPECT_EQ(http_get_host(port, path, this_host() + ".attacker.example").status, 403);
  }
  // Figures and health answer any name (Prometheus and probes name the target their own way).
  EXPECT_EQ(http_get_host(port, "/metrics", "attacker.example").status, 200);
  EXPECT_EQ(http_get_host(port, "/", "attacker.example").status, 200);

  const auto listed_port = static_cast<uint16_t>(free_port());
  Subprocess listed(ddprun({"--http_port", std::to_string(listed_port), "--http_allowed_hosts", "attacker.example",
                            "--nproc_per_node", "1", TEST_WORKER_BIN, "sleep", "120"}));
  ASSERT_TRUE(listed.wait_for([&] { return job_view(listed_port).is_object(); }, 60s));
  EXPECT_EQ(http_get_host(listed_port, "/api/job", "attacker.example:80").status, 200);
  EXPECT_EQ(http_get_host(listed_port, "/api/job", "other.example").status, 403);
}

TEST(JobPageProcessTest, AnAllowedHostThatIsNoNameIsABadCommandLine) {
  const Finished f = Subprocess(ddprun({"--http_port", "0", "--http_allowed_hosts", "a b", "--nproc_per_node", "1",
                                        TEST_WORKER_BIN, "sleep", "0"}))
                         .wait(60s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("--http_allowed_hosts"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("'a b'"), std::string::npos) << f.err;
}

uint16_t metrics_port(const Daemon& d) {
  const std::string marker = "metrics on http://127.0.0.1:";
  const std::string log = d.log_with(marker);
  const size_t at = log.find(marker);
  return at == std::string::npos ? 0 : static_cast<uint16_t>(std::stoi(log.substr(at + marker.size())));
}

// The daemon's jobs page the same way, with --metrics-allowed-hosts.
TEST(JobPageProcessTest, TheDaemonsPageAnswersOnlyUnderThisHostsNamesAndTheListedOnes) {
  DaemonOptions o;
  o.args = {"--metrics-port", "0"};
  Daemon d(DAEMON_BIN, o);
  const uint16_t port = metrics_port(d);
  ASSERT_NE(port, 0) << d.log();
  for (const char* path : {"/ui", "/api/jobs"}) {
    for (const std::string& host : own_hosts(port)) EXPECT_EQ(http_get_host(port, path, host).status, 200) << host;
    EXPECT_EQ(http_get_host(port, path, std::nullopt).status, 200);
    const HttpAnswer refused = http_get_host(port, path, "attacker.example");
    EXPECT_EQ(refused.status, 403) << refused.whole;
    EXPECT_NE(refused.body.find("--metrics-allowed-hosts"), std::string::npos) << refused.body;
  }
  EXPECT_EQ(http_get_host(port, "/metrics", "attacker.example").status, 200);

  o.args = {"--metrics-port", "0", "--metrics-allowed-hosts", ".example"};
  Daemon listed(DAEMON_BIN, o);
  const uint16_t listed_port = metrics_port(listed);
  ASSERT_NE(listed_port, 0) << listed.log();
  EXPECT_EQ(http_get_host(listed_port, "/api/jobs", "attacker.example").status, 200);
  EXPECT_EQ(http_get_host(listed_port, "/api/jobs", "attacker.test").status, 403);
}

std::string top_bin() {
  const char* other = std::getenv("DDPRUN_TEST_DDPRUN_TOP_BIN");
  return other && *other ? other : DDPRUN_TOP_BIN;
}

// Two replica groups of one job on this host, each with a page (the user's command: no
// --local_addr). ddprun-top names each by its group's run id, JOB.rgN as their logs say it, and JOB
// alone lists both. Before, both pages were advertised as JOB: only a port told them apart, and
// JOB.rg1 was no job.
TEST(JobPageProcessTest, DdprunTopNamesEachReplicaGroupOfAJobByItsRunId) {
  Daemon d(DAEMON_BIN);
  const std::string job = "topjob" + std::to_string(::getpid());
  std::vector<uint16_t> ports;
  std::vector<std::unique_ptr<Subprocess>> groups;
  for (int g = 0; g < 2; ++g) {
    ports.push_back(static_cast<uint16_t>(free_port()));
    groups.push_back(std::make_unique<Subprocess>(
        ddprun({"--http_port", std::to_string(ports.back()), "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", "127.0.0.1:" + std::to_string(d.port()), "--rdzv_id", job, "--replica_group",
                std::to_string(g), TEST_WORKER_BIN, "sleep", "120"})));
  }
  for (int g = 0; g < 2; ++g) {
    ASSERT_TRUE(groups[g]->wait_for([&] { return job_view(ports[g]).is_object(); }, 60s)) << groups[g]->err();
  }
  const Finished one = Subprocess({top_bin(), "--once", job + ".rg1"}).wait(60s);
  EXPECT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(one.out.find(":" + std::to_string(ports[1])), std::string::npos) << one.out;
  const Finished both = Subprocess({top_bin(), "--once", job}).wait(60s);
  EXPECT_EQ(both.exit_code, 1) << both.out;
  EXPECT_NE(both.err.find("several jobs run with run id '" + job + "'"), std::string::npos) << both.err;
  EXPECT_NE(both.err.find("run id " + job + ".rg0, port " + std::to_string(ports[0])), std::string::npos) << both.err;
  EXPECT_NE(both.err.find("run id " + job + ".rg1, port " + std::to_string(ports[1])), std::string::npos) << both.err;
}

}  // namespace
}  // namespace ddprun::test
