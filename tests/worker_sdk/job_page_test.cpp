// The job page (--http_port, /ui) in a real browser: Debian's chromium, headless, loads the page of
// a running 4-rank DDP job (the SDK's worker) in which rank 3 computes 40 ms longer per step. The
// page shows the 4 ranks and marks rank 3 as the straggler after refreshing itself; it asks no
// host but the agent for anything (chromium's own network log says what it fetched); a screenshot
// is left in the build's test-artifacts/. The agent's /metrics passes promtool. The daemon's page
// (ddprun-rendezvous --metrics-port) lists two jobs and shows one's straggler as the agent's does.
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <algorithm>
#include <map>
#include <memory>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "tests/support/daemon.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/http.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"
#include "tests/support/files.hpp"
#include "tests/support/job_node.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

// A program's path on PATH, or "".
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin");
  std::string d;
  while (std::getline(dirs, d, ':')) {
    const fs::path candidate = fs::path(d) / name;
    if (!d.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}
std::string chromium_path() { return on_path("chromium"); }

// Headless chromium with nothing of its own to fetch (no updates, no sync, no first-run pages).
std::vector<std::string> chromium(const fs::path& profile, std::vector<std::string> args) {
  std::vector<std::string> argv = {chromium_path(),
                                   "--headless",
                                   "--no-sandbox",  // as root, in a container
                                   "--disable-gpu",
                                   "--no-first-run",
                                   "--no-default-browser-check",
                                   "--disable-background-networking",
                                   "--disable-component-update",
                                   "--disable-sync",
                                   "--disable-default-apps",
                                   "--disable-extensions",
                                   "--disable-domain-reliability",
                                   "--user-data-dir=" + profile.string(),
                                   "--window-size=1200,900"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The URLs a page asked for, from a chromium network log (--log-net-log): every request job whose
// initiator is an origin (a page's subresources, fetches) or that belongs to `site`'s pages (the
// navigation). The browser's own traffic (its update and account checks, "not an origin", another
// site's key) is not the page's.
std::set<std::string> page_requests(const json& log, const std::string& site) {
  std::set<std::string> out;
  int start_job = -1;
  for (auto it = log["constants"]["logEventTypes"].begin(); it != log["constants"]["logEventTypes"].end(); ++it) {
    if (it.key() == "URL_REQUEST_START_JOB") start_job = it.value().get<int>();
  }
  for (const auto& e : log["events"]) {
    if (e.value("type", -1) != start_job || !e.contains("params")) continue;
    const json& p = e["params"];
    const std::string initiator = p.value("initiator", "");
    const std::string key = p.value("network_isolation_key", "");
    if ((!initiator.empty() && initiator != "not an origin") || key.find(site) != std::string::npos) {
      out.insert(p.value("url", ""));
    }
  }
  return out;
}

// The DOM of `url` after three seconds of the page's own time (two refreshes), with chromium's
// network log in `netlog`.
std::string dom_of(const fs::path& profile, const fs::path& netlog, const std::string& url) {
  fs::remove(netlog);
  Subprocess browser(
      chromium(profile, {"--log-net-log=" + netlog.string(), "--virtual-time-budget=3000", "--dump-dom", url}));
  const Finished f = browser.wait(60s);
  return f.out.empty() ? "chromium printed no DOM (exit code " + std::to_string(f.exit_code) + "): " + f.err : f.out;
}

// A screenshot of `url` in the build's test-artifacts/, for people; checks it is a PNG.
void screenshot(const fs::path& profile, const std::string& url, const std::string& name) {
  fs::create_directories(TEST_ARTIFACTS_DIR);
  const fs::path shot = fs::path(TEST_ARTIFACTS_DIR) / name;
  fs::remove(shot);
  Subprocess camera(chromium(profile, {"--virtual-time-budget=3000", "--screenshot=" + shot.string(), url}));
  camera.wait(60s);
  const std::string png = read_file(shot);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << "no screenshot at " << shot;
}

// The ranks a page's DOM shows ("data-rank") and which of them it marks as stragglers.
std::map<int, bool> ranks_shown(const std::string& dom) {
  std::map<int, bool> ranks;
  const std::regex cell("data-rank=\"([0-9]+)\" data-straggler=\"(true|false)\"");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), cell); it != std::sregex_iterator(); ++it) {
    ranks[std::stoi((*it)[1])] = (*it)[2] == "true";
  }
  return ranks;
}

// Every URL the page asked for is on `origin` ("http://127.0.0.1:PORT/"), and `needed` are among them.
void only_from(const fs::path& netlog, const std::string& origin, const std::vector<std::string>& needed) {
  const json log = json::parse(read_file(netlog), nullptr, false);
  ASSERT_TRUE(log.is_object()) << "chromium wrote no network log at " << netlog;
  const std::set<std::string> urls = page_requests(log, "http://127.0.0.1");
  for (const auto& u : needed) EXPECT_TRUE(urls.count(u)) << "the log does not show the page's request for " << u;
  for (const auto& u : urls) EXPECT_EQ(u.rfind(origin, 0), 0u) << "the page fetched " << u;
}

// Loads `url` until its page marks rank 3 as the straggler (90 s at most), leaving the DOM in `dom`;
// then every rank shown is one of the 4, rank 3 alone marked.
// Whether the page at `url` comes to show exactly `expected` (each rank shown, and whether it is
// marked) within 90 s; `dom` is the last one read. A busy machine can slow any rank for a while, so
// the page is read again until it shows the expected ranks.
bool shows_ranks(const fs::path& profile, const fs::path& netlog, const std::string& url,
                 const std::map<int, bool>& expected, std::string& dom) {
  const bool shown = wait_until(
      [&] {
        dom = dom_of(profile, netlog, url);
        return ranks_shown(dom) == expected;
      },
      90s);
  EXPECT_EQ(ranks_shown(dom), expected) << dom;
  return shown;
}

bool rank_3_marked(const fs::path& profile, const fs::path& netlog, const std::string& url, std::string& dom) {
  return shows_ranks(profile, netlog, url, {{0, false}, {1, false}, {2, false}, {3, true}}, dom);
}

// An IPv4 address of this host that is not a loopback one, or "".
std::string other_address_of_this_host() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a && found.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// A 4-rank DDP job whose rank 3 computes 40 ms longer per step, with its page on `port`; returns
// once every rank has stepped, with the job's view then.
json start_throttled_job(Subprocess*& job, int port, const std::string& run_id) {
  job = new Subprocess({DDPRUN_BIN, "--rdzv_id", run_id, "--nproc_per_node", "4", "--http_port", std::to_string(port),
                        SDK_TEST_WORKER_BIN, "train", "1000000", "-1", "3", "40"});
  json api;
  const bool stepping = wait_until(
      [&] {
        try {
          const HttpAnswer a = http_get(static_cast<uint16_t>(port), "/api/job");
          api = json::parse(a.body, nullptr, false);
        } catch (const std::exception&) {
          return false;
        }
        if (!api.is_object() || api["ranks"].size() != 4) return false;
        for (const auto& r : api["ranks"]) {
          if (r["step"].get<int>() < 5) return false;
        }
        return true;
      },
      120s);
  EXPECT_TRUE(stepping) << api.dump(2) << job->err();
  return api;
}

TEST(JobPageTest, ABrowserShowsEveryRankAndMarksTheThrottledOne) {
  ASSERT_FALSE(chromium_path().empty()) << "chromium is missing (Debian's chromium package; scripts/install_deps.sh)";
  const int port = free_port();
  TempDir dir;
  Subprocess* started = nullptr;
  const json api = start_throttled_job(started, port, "page-test");
  std::unique_ptr<Subprocess> job(started);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(api["schema"], "ddprun-job-view/1");
  EXPECT_EQ(api["phase"]["name"], "running");

  // Prometheus' linter takes the agent's metrics as they are, one series per rank.
  const HttpAnswer metrics = http_get(static_cast<uint16_t>(port), "/metrics");
  EXPECT_EQ(metrics.status, 200);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(metrics.body.find("ddprun_rank_steps_total{rank=\"" + std::to_string(r) + "\"}"), std::string::npos)
        << metrics.body;
  }
  const Lint lint = promtool_check(metrics.body);
  ASSERT_NE(lint.exit_code, 127) << "promtool is missing (Debian's prometheus package; scripts/install_deps.sh)";
  EXPECT_EQ(lint.exit_code, 0) << lint.says;
  EXPECT_EQ(lint.says, "") << metrics.body;

  // The browser: the DOM after two refresh periods of the page (1.5 s each).
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/ui";
  const fs::path netlog = dir.path / "netlog.json";
  std::string dom;
  EXPECT_TRUE(rank_3_marked(dir.path / "profile", netlog, url, dom)) << dom;
  // The page refreshed itself from /api/job (it counts its refreshes on <body>).
  std::smatch refreshes;
  ASSERT_TRUE(std::regex_search(dom, refreshes, std::regex("data-refreshes=\"([0-9]+)\""))) << dom;
  EXPECT_GE(std::stoi(refreshes[1]), 1);
  // Nothing was fetched from anywhere but the agent.
  const std::string agent = "http://127.0.0.1:" + std::to_string(port) + "/";
  only_from(netlog, agent, {url, agent + "ui.js", agent + "api/job"});
  screenshot(dir.path / "profile", url, "job_page.png");

  // The page holds the workers' output: another host (this one by another address) is refused.
  if (const std::string other = other_address_of_this_host(); !other.empty()) {
    const HttpAnswer far = http_get(static_cast<uint16_t>(port), "/api/job", other.c_str());
    EXPECT_EQ(far.status, 403) << far.whole;
    EXPECT_EQ(http_get(static_cast<uint16_t>(port), "/metrics", other.c_str()).status, 200);
  }

  job->signal(SIGTERM);
  EXPECT_FALSE(job->wait(60s).timed_out);
}

// One node of a 2-node job on the daemon at `store_port`, `nproc` ranks each, whose rank
// `slow_rank` computes `slow_ms` longer per step; nodes publish their ranks' rates every second.
std::unique_ptr<Subprocess> daemon_job_node(uint16_t store_port, const std::string& run_id, int node, int nproc,
                                            int slow_rank, int slow_ms) {
  return JobNode(node)
      .meet(at_store(store_port, run_id))
      .flags({"--nproc_per_node", std::to_string(nproc)})
      .env({{"DDPRUN_STEP_RATES_PERIOD", "1"}})
      .start({SDK_TEST_WORKER_BIN, "train", "1000000", "-1", std::to_string(slow_rank), std::to_string(slow_ms)});
}

// The daemon's page (--metrics-port): its list shows both jobs it holds, a link each; a job's page
// shows every node's ranks (2 nodes x 2) with the throttled one marked, as the nodes publish them.
TEST(JobPageTest, TheDaemonsPageListsItsJobsAndShowsEachWithItsStraggler) {
  ASSERT_FALSE(chromium_path().empty()) << "chromium is missing (Debian's chromium package; scripts/install_deps.sh)";
  TempDir dir;
  DaemonOptions with_page;
  with_page.args = {"--metrics-port", "0"};
  Daemon daemon(RENDEZVOUS_BIN, with_page);
  const int port = daemon.metrics_port();
  ASSERT_NE(port, 0) << daemon.log();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(daemon_job_node(daemon.port(), "daemon-page-a", node, 2, 3, 40));
    nodes.push_back(daemon_job_node(daemon.port(), "daemon-page-b", node, 1, 1, 250));
  }

  const std::string origin = "http://127.0.0.1:" + std::to_string(port) + "/";
  const fs::path netlog = dir.path / "netlog.json";
  std::string dom;
  // The list: both jobs, running, each a link to its page.
  EXPECT_TRUE(wait_until(
      [&] {
        dom = dom_of(dir.path / "profile", netlog, origin + "ui");
        return std::regex_search(dom, std::regex("data-job=\"daemon-page-a\" data-state=\"running\"")) &&
               std::regex_search(dom, std::regex("data-job=\"daemon-page-b\" data-state=\"running\""));
      },
      120s))
      << dom << daemon.log();
  EXPECT_NE(dom.find("href=\"ui?job=daemon-page-a\""), std::string::npos) << dom;
  only_from(netlog, origin, {origin + "ui", origin + "ui.js", origin + "api/jobs"});

  // A job: its 4 ranks from both nodes, rank 3 marked.
  const std::string url = origin + "ui?job=daemon-page-a";
  EXPECT_TRUE(rank_3_marked(dir.path / "profile", netlog, url, dom)) << dom;
  only_from(netlog, origin, {url, origin + "ui.js", origin + "api/job?job=daemon-page-a"});
  // The other job's page has its own two ranks and its own straggler (rank 1, 250 ms longer): each
  // job is judged on its own ranks.
  EXPECT_TRUE(shows_ranks(dir.path / "profile", netlog, origin + "ui?job=daemon-page-b", {{0, false}, {1, true}}, dom));
  screenshot(dir.path / "profile", origin + "ui", "daemon_jobs.png");
  screenshot(dir.path / "profile", url, "daemon_job_page.png");

  // (Who may look is JobsPageTest's: this daemon listens on loopback alone.)
  EXPECT_EQ(http_get(static_cast<uint16_t>(port), "/api/job?job=nojob").status, 404);
  for (auto& n : nodes) n->signal(SIGTERM);
  for (auto& n : nodes) EXPECT_FALSE(n->wait(60s).timed_out);
}

// The rows of ranks in a ddprun-top table: the rank numbers, top to bottom, and whether the first
// is named the straggler.
std::vector<int> ranks_listed(const std::string& table, bool& first_is_straggler) {
  std::vector<int> ranks;
  std::stringstream lines(table);
  std::string line;
  bool in_table = false;
  while (std::getline(lines, line)) {
    if (line.find("RANK") != std::string::npos && line.find("STEP TIME") != std::string::npos) {
      in_table = true;
      continue;
    }
    std::smatch m;
    if (in_table && std::regex_search(line, m, std::regex("^ *([0-9]+) +[0-9]+ +[0-9]+ "))) {
      if (ranks.empty()) first_is_straggler = line.find("straggler") != std::string::npos;
      ranks.push_back(std::stoi(m[1]));
    }
  }
  return ranks;
}

TEST(JobPageTest, DdprunTopInATerminalListsTheThrottledRankFirst) {
  const std::string tmux = on_path("tmux");
  ASSERT_FALSE(tmux.empty()) << "tmux is missing (Debian's tmux package; scripts/install_deps.sh)";
  const int port = free_port();
  const std::string run_id = "top-test-" + std::to_string(::getpid());
  Subprocess* started = nullptr;
  start_throttled_job(started, port, run_id);
  std::unique_ptr<Subprocess> job(started);
  ASSERT_FALSE(HasFailure());

  // In a real terminal (tmux), refreshing itself: the ranks, the throttled one first.
  const std::string socket = "ddprun-test-" + std::to_string(::getpid());
  Subprocess({tmux, "-L", socket, "new-session", "-d", "-x", "140", "-y", "30",
              std::string(DDPRUN_TOP_BIN) + " --interval 0.5 127.0.0.1:" + std::to_string(port)})
      .wait(30s);
  std::string screen;
  bool straggler_first = false;
  std::vector<int> ranks;
  EXPECT_TRUE(wait_until(
      [&] {
        screen = Subprocess({tmux, "-L", socket, "capture-pane", "-p"}).wait(30s).out;
        ranks = ranks_listed(screen, straggler_first);
        return ranks.size() == 4 && ranks[0] == 3 && straggler_first;
      },
      60s))
      << screen;
  EXPECT_EQ(std::set<int>(ranks.begin(), ranks.end()), (std::set<int>{0, 1, 2, 3})) << screen;
  EXPECT_NE(screen.find("ddprun job " + run_id + " at 127.0.0.1:" + std::to_string(port) + ": running"),
            std::string::npos)
      << screen;
  Subprocess({tmux, "-L", socket, "kill-server"}).wait(30s);

  // Not a terminal, found by its run id: one plain table, no terminal codes.
  const Finished once = Subprocess({DDPRUN_TOP_BIN, "--once", run_id}).wait(30s);
  EXPECT_EQ(once.exit_code, 0) << once.err;
  EXPECT_EQ(once.out.find('\x1b'), std::string::npos) << once.out;
  straggler_first = false;
  ranks = ranks_listed(once.out, straggler_first);
  ASSERT_EQ(ranks.size(), 4u) << once.out;
  EXPECT_EQ(ranks[0], 3) << once.out;

  // A run id nobody runs under: says so, with the jobs that do run, and exits 1.
  const Finished none = Subprocess({DDPRUN_TOP_BIN, "--once", "no-such-job"}).wait(30s);
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("no job of yours with run id 'no-such-job'"), std::string::npos) << none.err;
  EXPECT_NE(none.err.find("run id " + run_id + ", port " + std::to_string(port)), std::string::npos) << none.err;

  job->signal(SIGTERM);
  EXPECT_FALSE(job->wait(60s).timed_out);
  // Gone with the job: ddprun-top finds no such job any more.
  EXPECT_EQ(Subprocess({DDPRUN_TOP_BIN, "--once", run_id}).wait(30s).exit_code, 1);
}

// --trace_file over a job that hangs, restarts and hangs again: a JSON trace Perfetto and chrome
// take as is, with a track per rank (its steps, its wait) and the node's rendezvous, attempts,
// restart, hangs and exit on the node's track.
TEST(JobPageTest, ATraceFileHasATrackPerRankAndTheNodesAttemptsRestartAndHangs) {
  TempDir dir;
  const fs::path trace = dir.path / "traces" / "job.json";  // its directory is made
  // Rank 1 stops stepping after 30 steps (in its own code); rank 0 waits for it.
  const Finished f = Subprocess({DDPRUN_BIN, "--nproc_per_node", "2", "--hang_timeout", "3", "--max_restarts", "1",
                                 "--log_dir", (dir.path / "logs").string(), "--trace_file", trace.string(),
                                 SDK_TEST_WORKER_BIN, "train", "30", "1", "-1", "0"})
                         .wait(180s);
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 124) << f.err;
  const json events = json::parse(read_file(trace), nullptr, false);
  ASSERT_TRUE(events.is_array()) << read_file(trace);
  std::map<int, std::string> tracks;  // tid -> name
  std::map<int, int> step_slices;     // tid -> slices of steps
  std::vector<std::string> node;      // the node track's slices and instants, in order
  int waits = 0;
  for (const json& e : events) {
    ASSERT_TRUE(e.contains("name") && e.contains("ph") && e.contains("pid")) << e.dump();
    const std::string ph = e["ph"], name = e["name"];
    if (ph == "M" && name == "thread_name") tracks[e["tid"]] = e["args"]["name"];
    if (ph == "X") {
      ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e["dur"].get<int64_t>() >= 0) << e.dump();
    }
    if (!e.contains("tid") || ph == "M") continue;
    const int tid = e["tid"];
    if (tid == 0 && (ph == "X" || ph == "i")) node.push_back(ph + " " + name);
    if (tid > 0 && ph == "X" && std::regex_match(name, std::regex("[0-9]+ steps?"))) {
      ++step_slices[tid];
      EXPECT_TRUE(e["args"]["step_ms"].is_number()) << e.dump();
    }
    if (tid == 1 && ph == "X" && name == "waiting on the others") ++waits;
  }
  EXPECT_EQ(tracks, (std::map<int, std::string>{{0, "node"}, {1, "rank 0"}, {2, "rank 1"}}));
  EXPECT_GE(step_slices[1], 1);
  EXPECT_GE(step_slices[2], 1);
  EXPECT_GE(waits, 1) << "rank 0 waited for rank 1 in the all-reduce";
  auto count = [&](const std::string& prefix) {
    return std::count_if(node.begin(), node.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
  };
  std::string all;
  for (const auto& n : node) all += n + "\n";
  EXPECT_EQ(count("X attempt: round 0"), 1) << all;
  EXPECT_EQ(count("X attempt: round 1"), 1) << all;
  EXPECT_EQ(count("X rendezvous"), 2) << all;
  EXPECT_EQ(count("i hang: "), 2) << all;
  EXPECT_EQ(count("i restart: "), 1) << all;
  EXPECT_EQ(count("i exit: hung, exit code 124"), 1) << all;
}

}  // namespace
}  // namespace ddprun::test
