// The daemon's job page (rendezvous/daemon/jobs_page.hpp) over a real store: what the job's nodes
// write (their records, their ranks' step rates, the round's keys) is what its page shows.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rendezvous/core/auth.hpp"
#include "rendezvous/daemon/jobs_page.hpp"
#include "rendezvous/jobs/job_keys.hpp"
#include "rendezvous/jobs/rank_rates.hpp"
#include "rendezvous/jobs/records.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::rdzv {
namespace {

using json = nlohmann::json;
using daemon::JobsPage;
using daemon::JobsPageSettings;

const auto kHere = boost::asio::ip::make_address("127.0.0.1");
const auto kThere = boost::asio::ip::make_address("10.1.2.3");
const auto kAdmitted = boost::asio::ip::make_address("10.9.9.9");

server::ServerOptions options() {
  server::ServerOptions o;
  o.port = 0;
  o.log_lifecycle = false;
  return o;
}

// What ddprun's agents write for a job of two nodes with `per_node` ranks each.
struct FakeJob {
  core::KvStore& store;
  std::string run_id;
  int64_t generation = 1;
  int per_node = 2;

  jobs::RoundKeys round(int r = 0) const { return jobs::JobKeys(run_id, generation).round(r); }
  void join() {
    store.set(jobs::JobKeys::generation_counter(run_id), std::to_string(generation));
    for (int node = 0; node < 2; ++node) {
      jobs::NodeRecord rec;
      rec.host = "host" + std::to_string(node);
      rec.addr = "10.0.0." + std::to_string(node + 1);
      rec.nproc = per_node;
      rec.nnodes = 2;
      store.set(round().node(node), jobs::encode(rec));
    }
    store.set(round().complete(), "1");
  }
  // Node `node` publishes its ranks' figures: each rank `ms` of compute per step, but `slow_rank`
  // `slow_ms`.
  void publish(int node, double ms, int slow_rank = -1, double slow_ms = 0, uint64_t step = 100, double seconds = 1) {
    json ranks = json::array();
    for (int local = 0; local < per_node; ++local) {
      jobs::RankRate r;
      r.rank = node * per_node + local;
      r.node = node;
      r.seconds = seconds;
      r.steps = std::max<uint64_t>(1, static_cast<uint64_t>(seconds * 10));
      r.compute_ms_per_step = r.rank == slow_rank ? slow_ms : ms;
      r.steps_per_second = 1e3 / (slow_ms > 0 ? slow_ms + 5 : ms + 5);
      r.step = step;
      r.idle_seconds = 0.1;
      r.waiting = r.rank != slow_rank;
      ranks.push_back(jobs::to_json(r));
    }
    store.set(round().rates(node), json{{"node", node}, {"time_ms", 0}, {"whole_run", false}, {"ranks", ranks}}.dump());
  }
};

struct Fixture {
  boost::asio::io_context io;
  server::Server server;
  explicit Fixture(server::ServerOptions o = options()) : server(io, std::move(o)) {}
  // Runs what the page posted: it reads what changed after the change, on the store's thread.
  void settle() {
    io.restart();
    io.poll();
  }
};

TEST(JobsPageTest, AJobsPageHasEveryNodesRanksAndMarksTheStraggler) {
  Fixture f;
  JobsPage page(f.io, f.server);
  FakeJob job{f.server.store(), "jobA"};
  job.join();
  job.publish(0, 2.0);
  job.publish(1, 2.0, /*slow_rank=*/3, /*slow_ms=*/45.0);
  f.settle();

  const auto view = page.job("jobA", 0);
  ASSERT_TRUE(view);
  EXPECT_EQ((*view)["schema"], "ddprun-job-view/1");
  EXPECT_EQ((*view)["source"], "daemon");
  EXPECT_EQ((*view)["phase"]["name"], "running");
  EXPECT_EQ((*view)["world_size"], 4);
  ASSERT_EQ((*view)["ranks"].size(), 4u) << view->dump(2);
  // The straggler first: the others wait for it.
  EXPECT_EQ((*view)["ranks"][0]["rank"], 3);
  EXPECT_EQ((*view)["ranks"][0]["straggler"], true);
  EXPECT_EQ((*view)["ranks"][0]["node"], 1);
  EXPECT_EQ((*view)["ranks"][0]["step"], 100);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ((*view)["ranks"][i]["straggler"], false) << i;
  EXPECT_EQ((*view)["stragglers"], 1);
  EXPECT_EQ((*view)["heat"]["rows"].size(), 4u);
  EXPECT_EQ((*view)["heat"]["values"][3].back(), 45.0);
  std::vector<std::string> kinds;
  for (const auto& e : (*view)["timeline"]) kinds.push_back(e["kind"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"start", "nodes", "nodes", "rendezvous"}));

  // The round ends in a failure: the page says so, and names the rank.
  jobs::Outcome failed;
  failed.kind = jobs::Outcome::Kind::Failure;
  failed.detail = "rank 3 exited with code 1";
  failed.failure = {{"rank", 3}, {"host", "host1"}, {"exit_code", 1}};
  f.server.store().set(job.round().end(), jobs::encode_outcome(failed));
  f.settle();
  const auto after = page.job("jobA", 0);
  EXPECT_EQ((*after)["phase"]["name"], "failed");
  EXPECT_EQ((*after)["phase"]["ok"], false);
  EXPECT_EQ((*after)["report"]["root_cause"]["rank"], 3) << after->dump(2);
  EXPECT_EQ((*after)["timeline"].back()["kind"], "restart");
  EXPECT_EQ((*after)["workers_alive"], 0);
}

// A run's first publication may cover a fraction of a second: too little to mark a rank by. The
// page judges each rank over its latest publications (about 5 s), as the agent's page does.
TEST(JobsPageTest, AShortFirstWindowMarksNobodyAndAWindowOfPublicationsDoes) {
  Fixture f;
  JobsPage page(f.io, f.server);
  FakeJob job{f.server.store(), "jobA"};
  job.join();
  job.publish(0, 20.0, -1, 0, 2, /*seconds=*/0.1);
  job.publish(1, 20.0, /*slow_rank=*/2, /*slow_ms=*/40.0, 2, 0.1);
  f.settle();
  auto view = page.job("jobA", 0);
  EXPECT_EQ((*view)["stragglers"], 0) << view->dump(2);
  // Then a second of even steps: rank 2's early hiccup is averaged away.
  job.publish(0, 20.0, -1, 0, 12);
  job.publish(1, 20.0, -1, 0, 12);
  f.settle();
  view = page.job("jobA", 0);
  EXPECT_EQ((*view)["stragglers"], 0) << view->dump(2);
  // A rank slow for seconds is marked.
  for (int i = 0; i < 3; ++i) {
    job.publish(0, 20.0, -1, 0, 22 + 10 * static_cast<uint64_t>(i));
    job.publish(1, 20.0, 3, 90.0, 22 + 10 * static_cast<uint64_t>(i));
    f.settle();
  }
  view = page.job("jobA", 0);
  EXPECT_EQ((*view)["stragglers"], 1) << view->dump(2);
  EXPECT_EQ((*view)["ranks"][0]["rank"], 3);
}

TEST(JobsPageTest, TheListHasEveryJobAndAnUnknownJobIsNotFound) {
  Fixture f;
  JobsPage page(f.io, f.server);
  FakeJob a{f.server.store(), "jobA"}, b{f.server.store(), "jobB", 1, 1};
  a.join();
  b.join();
  a.publish(0, 2.0);
  a.publish(1, 2.0, 3, 45.0);
  b.publish(0, 3.0);
  b.publish(1, 3.0);
  const json list = page.jobs(0);  // catches up by itself
  EXPECT_EQ(list["schema"], "ddprun-jobs/1");
  ASSERT_EQ(list["jobs"].size(), 2u) << list.dump(2);
  EXPECT_EQ(list["jobs"][0]["run_id"], "jobA");
  EXPECT_EQ(list["jobs"][0]["stragglers"], 1);
  EXPECT_EQ(list["jobs"][0]["ranks_reporting"], 4);
  EXPECT_EQ(list["jobs"][1]["run_id"], "jobB");
  EXPECT_EQ(list["jobs"][1]["world_size"], 2);
  EXPECT_FALSE(page.job("nojob", 0));
  EXPECT_FALSE(page.job("../../etc", 0));

  const auto ui = page.serve({"/ui", kHere});
  ASSERT_TRUE(ui);
  EXPECT_EQ(ui->status, 200u);
  EXPECT_NE(ui->body.find("\"ddprun-jobs/1\""), std::string::npos);
  EXPECT_EQ(page.serve({"/ui?job=jobB", kHere})->status, 200u);
  const auto slash = page.serve({"/ui/?job=jobB", kHere});  // the address with a trailing slash
  ASSERT_TRUE(slash);
  EXPECT_NE(slash->body.find("\"run_id\":\"jobB\""), std::string::npos);
  const auto list_slash = page.serve({"/ui/", kHere});
  ASSERT_TRUE(list_slash);
  EXPECT_NE(list_slash->body.find("\"ddprun-jobs/1\""), std::string::npos);
  EXPECT_EQ(page.serve({"/api/job?job=jobA", kHere})->status, 200u);
  EXPECT_EQ(page.serve({"/api/job?job=nojob", kHere})->status, 404u);
  EXPECT_EQ(page.serve({"/api/job", kHere})->status, 400u);
  EXPECT_EQ(page.serve({"/ui.js", kHere})->status, 200u);
  EXPECT_FALSE(page.serve({"/metrics", kHere}));  // the metrics' own
  EXPECT_FALSE(page.serve({"/", kHere}));
}

TEST(JobsPageTest, HistoryIsBoundedAndGoesWithTheJob) {
  Fixture f;
  JobsPageSettings s;
  s.history = 8;
  s.max_jobs = 2;
  JobsPage page(f.io, f.server, s);
  FakeJob a{f.server.store(), "jobA"};
  a.join();
  for (int i = 0; i < 20; ++i) {
    a.publish(0, 2.0 + i);
    f.settle();  // each publication read (changes made between two reads are read once)
  }
  auto view = page.job("jobA", 0);
  EXPECT_EQ((*view)["heat"]["columns"], 8);
  EXPECT_EQ((*view)["heat"]["values"][0].back(), 21.0);

  // The janitor forgets the job (its counter goes last): so does the page. A new job of the same
  // id starts with an empty history.
  std::vector<std::string> keys;
  f.server.store().for_each("/ddprun/jobA/", [&](std::string_view k, const std::string&) { keys.emplace_back(k); });
  for (const auto& k : keys) f.server.store().remove(k);
  f.settle();
  EXPECT_FALSE(page.job("jobA", 0));
  a.join();
  a.publish(0, 2.0);
  f.settle();
  view = page.job("jobA", 0);
  EXPECT_EQ((*view)["heat"]["columns"], 1);

  // At most max_jobs followed: the one changed least recently goes.
  FakeJob b{f.server.store(), "jobB"}, c{f.server.store(), "jobC"};
  b.join();
  b.publish(0, 2.0);
  f.settle();
  c.join();
  c.publish(0, 2.0);
  f.settle();
  EXPECT_EQ((*page.job("jobA", 0))["ranks"].size(), 0u) << "jobA was changed least recently";
  EXPECT_EQ((*page.job("jobC", 0))["ranks"].size(), 2u);
}

TEST(JobsPageTest, WhoMayLookFollowsTheStoresOwnAccess) {
  {  // An open store that admits anyone: anyone (they could read every key anyway).
    Fixture f;
    JobsPage page(f.io, f.server);
    EXPECT_EQ(page.serve({"/api/jobs", kThere})->status, 200u);
    f.server.allow_peers({"10.9.9.9"});
    const auto refused = page.serve({"/api/jobs", kThere});
    EXPECT_EQ(refused->status, 403u);
    EXPECT_NE(refused->body.find("ssh -L"), std::string::npos);
    EXPECT_EQ(page.serve({"/api/jobs", kAdmitted})->status, 200u);
    EXPECT_EQ(page.serve({"/api/jobs", kHere})->status, 200u);
  }
  {  // A protected store: this host only, whatever the peer list.
    core::Token token;
    token.cluster_secret = "this-is-the-cluster-secret-0123456789";
    server::ServerOptions o = options();
    o.secret = core::store_secret(token);
    Fixture f(o);
    JobsPage page(f.io, f.server);
    for (const char* path : {"/ui", "/ui.js", "/api/jobs", "/api/job?job=x"}) {
      EXPECT_EQ(page.serve({path, kThere})->status, 403u) << path;
      EXPECT_EQ(page.serve({path, kAdmitted})->status, 403u) << path;
    }
    EXPECT_EQ(page.serve({"/api/jobs", kHere})->status, 200u);
    EXPECT_EQ(page.serve({"/api/jobs", boost::asio::ip::make_address("::ffff:127.0.0.1")})->status, 200u);
  }
}

TEST(JobsPageTest, TheObserverItStandsInFrontOfIsStillToldAndPutBack) {
  struct Counter : core::ChangeObserver {
    int changes = 0;
    void on_change(std::string_view, const int64_t*) override { ++changes; }
  } counter;
  Fixture f;
  f.server.store().set_observer(&counter);
  {
    JobsPage page(f.io, f.server);
    f.server.store().set("a", "1");
    f.server.store().add("b", 2);
    EXPECT_EQ(counter.changes, 2);
  }
  EXPECT_EQ(f.server.store().observer(), &counter);
  f.server.store().set("c", "1");
  EXPECT_EQ(counter.changes, 3);
}

}  // namespace
}  // namespace ddprun::rdzv
