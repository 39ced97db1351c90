// The job's view (launcher/view): what the page, /api/job and /metrics show, from the watchdog's
// readings; bounded whatever the job's size; the page's data kept from other hosts and from markup.
#include <gtest/gtest.h>

#include <boost/asio/ip/address.hpp>
#include <cmath>

#include "common/prometheus.hpp"
#include "launcher/view/job_page.hpp"
#include "launcher/top/top_table.hpp"
#include "launcher/view/job_view.hpp"
#include "rendezvous/server/web_page.hpp"

namespace ddprun::launcher {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using view::JobView;
using view::ViewSettings;
using watchdog::RankReading;
using Clock = std::chrono::steady_clock;

// Ranks that step together, as in synchronous DDP: each step every rank computes for its own time,
// and all but the slowest wait for it. `compute_ms[r]`: rank r's compute time per step.
struct Job {
  std::vector<double> compute_ms;
  Clock::time_point t = Clock::time_point{} + 1000s;
  std::vector<RankReading> ranks;

  explicit Job(std::vector<double> compute) : compute_ms(std::move(compute)) {
    for (size_t r = 0; r < compute_ms.size(); ++r) {
      RankReading x;
      x.rank = static_cast<int>(r);
      x.local_rank = static_cast<int>(r);
      x.pid = 1000 + static_cast<int>(r);
      x.alive = x.reports = x.reports_waits = true;
      ranks.push_back(x);
    }
  }
  // `steps` steps, then one reading of every rank.
  void step(JobView& v, int steps) {
    const double slowest = *std::max_element(compute_ms.begin(), compute_ms.end());
    t += std::chrono::microseconds(static_cast<int64_t>(slowest * 1000 * steps));
    for (size_t r = 0; r < ranks.size(); ++r) {
      ranks[r].steps += static_cast<uint64_t>(steps);
      ranks[r].wait_ns += static_cast<uint64_t>((slowest - compute_ms[r]) * 1e6 * steps);
      ranks[r].last_step = ranks[r].last_progress = t;
    }
    v.update(t, ranks);
  }
};

TEST(JobViewTest, TheRankWhoseStepsTakeLongestIsMarkedAndListedFirst) {
  JobView v;
  Job job({10, 11, 10, 40});
  for (int i = 0; i < 6; ++i) job.step(v, 20);
  const auto rows = v.rows();
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].rank, 3);
  EXPECT_TRUE(rows[0].straggler);
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_FALSE(rows[i].straggler) << rows[i].rank;
  // Step time is the rank's own work, not the wall time every rank shares.
  ASSERT_TRUE(rows[0].step_ms);
  EXPECT_NEAR(*rows[0].step_ms, 40.0, 0.01);
  const auto rank0 = std::find_if(rows.begin(), rows.end(), [](auto& r) { return r.rank == 0; });
  ASSERT_TRUE(rank0->step_ms);
  EXPECT_NEAR(*rank0->step_ms, 10.0, 0.01);
  ASSERT_TRUE(rank0->steps_per_second);
  EXPECT_NEAR(*rank0->steps_per_second, 25.0, 0.01);  // one step per 40 ms, for every rank
  EXPECT_EQ(v.snapshot()["stragglers"], 1);

  // Ranks that take the same time are nobody's straggler; nor is anyone with the mark off.
  JobView even;
  Job same({10, 10.5, 10, 10.2});
  for (int i = 0; i < 6; ++i) same.step(even, 20);
  for (const auto& r : even.rows()) EXPECT_FALSE(r.straggler) << r.rank;
  JobView off(ViewSettings{.straggler_factor = 0});
  Job slow({10, 10, 10, 40});
  for (int i = 0; i < 6; ++i) slow.step(off, 20);
  for (const auto& r : off.rows()) EXPECT_FALSE(r.straggler) << r.rank;
}

TEST(JobViewTest, AWaitingRanksHiccupIsNoStraggler) {
  // Ranks 0-2 wait for rank 3 (40 ms a step); rank 1's own work is twice the others' 1.5 ms, but
  // nobody waits for 1.5 ms of a 40 ms step: only rank 3 is marked.
  JobView v;
  Job job({1.5, 3.2, 1.4, 40});
  for (int i = 0; i < 6; ++i) job.step(v, 20);
  for (const auto& r : v.rows()) EXPECT_EQ(r.straggler, r.rank == 3) << r.rank;
}

TEST(JobViewTest, ARankWithoutProgressIsListedBeforeTheOthersWithItsIdleTime) {
  JobView v(ViewSettings{.straggler_factor = 0});
  Job job({10, 10, 10});
  job.step(v, 10);
  // Rank 1 stops: the others go on, its readings stay.
  auto stuck = job.ranks[1];
  job.step(v, 10);
  job.ranks[1] = stuck;
  v.update(job.t, job.ranks);
  const auto rows = v.rows();
  EXPECT_EQ(rows[0].rank, 1);
  EXPECT_EQ(rows[0].step, 10u);
  EXPECT_GT(rows[0].idle_seconds, rows[1].idle_seconds);
}

TEST(JobViewTest, TheHeatMapIsBoundedAndBinsRanksIntoTheirSlowest) {
  const ViewSettings s{.history = 20, .max_rows = 100, .max_listed = 50};
  JobView v(s);
  std::vector<double> compute(1000, 10.0);
  compute[457] = 90.0;
  Job job(compute);
  for (int i = 0; i < 50; ++i) job.step(v, 2);
  const json snap = v.snapshot();
  const json& heat = snap["heat"];
  EXPECT_EQ(heat["columns"], 20);
  EXPECT_EQ(heat["ranks_per_row"], 10);
  ASSERT_EQ(heat["rows"].size(), 100u);
  ASSERT_EQ(heat["values"].size(), 100u);
  EXPECT_EQ(heat["rows"][45], json::array({450, 459}));
  for (size_t row = 0; row < 100; ++row) {
    const json& values = heat["values"][row];
    ASSERT_EQ(values.size(), 20u);
    const double expected = row == 45 ? 90.0 : 10.0;  // the bin shows its slowest rank
    EXPECT_NEAR(values.back().get<double>(), expected, 0.1) << row;
  }
  // 50 listed, the straggler first; the rest counted, not listed.
  ASSERT_EQ(snap["ranks"].size(), 50u);
  EXPECT_EQ(snap["ranks"][0]["rank"], 457);
  EXPECT_EQ(snap["ranks_not_listed"], 950);
  EXPECT_EQ(snap["ranks_here"], 1000);
}

TEST(JobViewTest, ANewRoundKeepsTheMapButStartsEachRanksCountersAgain) {
  JobView v;
  Job job({10, 10});
  for (int i = 0; i < 5; ++i) job.step(v, 10);
  v.new_round(1, 2, 0);
  // New processes, counting from zero: no step time from the old counters.
  for (auto& r : job.ranks) {
    r.pid += 100;
    r.steps = 0;
    r.wait_ns = 0;
  }
  v.update(job.t + 1s, job.ranks);
  for (const auto& r : v.rows()) {
    EXPECT_FALSE(r.step_ms) << r.rank;
    EXPECT_EQ(r.step, 0u);
  }
  const json heat = v.snapshot()["heat"];
  EXPECT_EQ(heat["columns"], 6);
  EXPECT_TRUE(heat["values"][0].back().is_null()) << heat.dump();
  EXPECT_NEAR(heat["values"][0][1].get<double>(), 10.0, 0.1) << heat.dump();
}

TEST(JobViewTest, TheTimelineIsBoundedAndKeepsItsFirstEntry) {
  JobView v(ViewSettings{.max_events = 10});
  v.event("rendezvous", "round 0: joining");
  for (int i = 0; i < 100; ++i) v.event("restart", "restart " + std::to_string(i));
  const json snap = v.snapshot();
  ASSERT_EQ(snap["timeline"].size(), 10u);
  EXPECT_EQ(snap["timeline"][0]["text"], "round 0: joining");
  EXPECT_EQ(snap["timeline"][9]["text"], "restart 99");
  EXPECT_EQ(snap["timeline_dropped"], 91);
}

TEST(JobViewTest, MetricsNameEveryRankAndThePhase) {
  JobView v;
  v.set_phase("running", "4 workers", true, 0);
  Job job({10, 10, 30});
  for (int i = 0; i < 6; ++i) job.step(v, 10);
  const std::string m = v.metrics();
  EXPECT_NE(m.find("ddprun_agent_phase{phase=\"running\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("ddprun_agent_phase{phase=\"hung\"} 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("ddprun_workers_alive 3\n"), std::string::npos) << m;
  EXPECT_NE(m.find("ddprun_rank_steps_total{rank=\"2\"} 60\n"), std::string::npos) << m;
  EXPECT_NE(m.find("ddprun_rank_straggler{rank=\"2\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("ddprun_rank_straggler{rank=\"0\"} 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("# TYPE ddprun_rank_steps_per_second gauge\n"), std::string::npos) << m;
}

TEST(JobViewTest, PrometheusLabelsAreEscaped) {
  EXPECT_EQ(prometheus::label("host", "a\"b\\c\nd"), "host=\"a\\\"b\\\\c\\nd\"");
}

TEST(JobViewTest, ThePageCarriesTheJobAsDataNeverAsMarkup) {
  JobView v;
  json report{{"root_cause", {{"stderr_tail", "</script><script>alert(1)</script>"}}}};
  v.set_report(report);
  const std::string page = rdzv::server::render_page(v.snapshot());
  EXPECT_EQ(page.find("<script>alert"), std::string::npos);
  EXPECT_NE(page.find("\\u003c/script>\\u003cscript>alert(1)"), std::string::npos);
  EXPECT_EQ(page.find("@INITIAL@"), std::string::npos);
  // Nothing in the page's files names another host.
  for (const std::string_view part : {rdzv::server::page_html(), rdzv::server::page_js(), rdzv::server::page_css()}) {
    EXPECT_EQ(part.find("http://"), std::string_view::npos);
    EXPECT_EQ(part.find("https://"), std::string_view::npos);
    EXPECT_EQ(part.find("//cdn"), std::string_view::npos);
  }
}

TEST(JobViewTest, ThePageAndItsDataAreForThisHostAloneAndMetricsForAnyone) {
  JobView v;
  const rdzv::server::HostCheck hosts;
  const auto local = boost::asio::ip::make_address("127.0.0.1");
  const auto mapped = boost::asio::ip::make_address("::ffff:127.0.0.1");
  const auto other = boost::asio::ip::make_address("10.1.2.3");
  for (const char* path : {"/ui", "/ui.js", "/ui.css", "/api/job", "/api/job?x=1", "/hang_report"}) {
    const auto far = view::serve_view(v, {path, other}, hosts);
    ASSERT_TRUE(far) << path;
    EXPECT_EQ(far->status, 403u) << path;
    EXPECT_NE(far->body.find("ssh -L"), std::string::npos) << far->body;
    const auto near = view::serve_view(v, {path, local}, hosts);
    ASSERT_TRUE(near) << path;
    EXPECT_EQ(near->status, std::string(path) == "/hang_report" ? 404u : 200u) << path;
    EXPECT_EQ(view::serve_view(v, {path, mapped}, hosts)->status, near->status) << path;
  }
  const auto ui = view::serve_view(v, {"/ui", local}, hosts);
  bool csp = false;
  for (const auto& [name, value] : ui->headers) {
    csp = csp || (name == "Content-Security-Policy" && value.find("default-src 'none'") != std::string::npos);
  }
  EXPECT_TRUE(csp);
  const auto metrics = view::serve_view(v, {"/metrics", other}, hosts);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200u);
  EXPECT_EQ(metrics->content_type, prometheus::kContentType);
  // Other paths are the health endpoint's.
  EXPECT_FALSE(view::serve_view(v, {"/", local}, hosts));
  EXPECT_FALSE(view::serve_view(v, {"/healthz", other}, hosts));

  // Asked under another site's name (DNS rebinding): refused, saying how to allow it; /metrics
  // answers any name, as Prometheus scrapes by its own.
  const auto as = [&](const char* path, std::string_view host) {
    rdzv::server::HttpRequest r{path, local};
    r.host = host;
    r.host_fields = 1;
    return view::serve_view(v, r, hosts);
  };
  for (const char* path : {"/ui", "/api/job", "/hang_report"}) {
    const auto refused = as(path, "attacker.example:8080");
    ASSERT_TRUE(refused) << path;
    EXPECT_EQ(refused->status, 403u) << path;
    EXPECT_NE(refused->body.find("attacker.example:8080"), std::string::npos) << refused->body;
    EXPECT_NE(refused->body.find("--http_allowed_hosts attacker.example "), std::string::npos) << refused->body;
    EXPECT_EQ(as(path, "localhost:8080")->status, std::string(path) == "/hang_report" ? 404u : 200u) << path;
  }
  EXPECT_EQ(as("/metrics", "attacker.example")->status, 200u);
  const rdzv::server::HostCheck listed({"attacker.example"});
  rdzv::server::HttpRequest named{"/api/job", local};
  named.host = "Attacker.Example.:9000";
  named.host_fields = 1;
  EXPECT_EQ(view::serve_view(v, named, listed)->status, 200u);
}

}  // namespace
}  // namespace ddprun::launcher

namespace ddprun::launcher {
namespace {

TEST(TopTableTest, TheTableFitsTheTerminalAndSaysWhatItLeftOut) {
  JobView v;
  v.set_identity("job7", "node-a", -1, 1);
  v.set_phase("running", "8 workers, round 0 (restart 0)", true, 0);
  std::vector<double> compute(8, 10.0);
  compute[6] = 50.0;
  Job job(compute);
  for (int i = 0; i < 6; ++i) job.step(v, 10);
  const json snap = v.snapshot();
  const std::string all = top::format_table(snap, "127.0.0.1:8080");
  EXPECT_EQ(all.rfind("ddprun job job7 at 127.0.0.1:8080: running (8 workers, round 0 (restart 0), for ", 0), 0u)
      << all;
  EXPECT_NE(all.find("8 of 8 worker(s) alive, 1 straggler(s)"), std::string::npos) << all;
  // The straggler's row comes first, under the header.
  const auto header = all.find("RANK");
  ASSERT_NE(header, std::string::npos);
  const std::string first =
      all.substr(all.find('\n', header) + 1, all.find('\n', all.find('\n', header) + 1) - all.find('\n', header) - 1);
  EXPECT_NE(first.find("     6 "), std::string::npos) << all;
  EXPECT_NE(first.find("50.0 ms"), std::string::npos) << all;
  EXPECT_NE(first.find("straggler"), std::string::npos) << all;
  EXPECT_EQ(all.find("more rank"), std::string::npos) << all;
  // 10 lines of terminal: 4 for the header, 5 ranks, and what was left out.
  const std::string small = top::format_table(snap, "127.0.0.1:8080", 40, 10);
  int lines = 0;
  for (const char c : small) lines += c == '\n';
  EXPECT_EQ(lines, 10) << small;
  EXPECT_NE(small.find("... 3 more rank(s)"), std::string::npos) << small;
  for (size_t at = 0, end; (end = small.find('\n', at)) != std::string::npos; at = end + 1) {
    EXPECT_LE(end - at, 40u) << small;
  }
}

}  // namespace
}  // namespace ddprun::launcher
