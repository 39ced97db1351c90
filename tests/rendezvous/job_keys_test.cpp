// The rendezvous key layout, the outcome encoding, the status summary and the janitor: pure logic.
#include "rendezvous/jobs/job_keys.hpp"
#include "rendezvous/daemon/job_summary.hpp"

#include <gtest/gtest.h>

#include "common/log.hpp"
#include "rendezvous/server/janitor.hpp"
#include "rendezvous/core/kv_store.hpp"
#include "rendezvous/jobs/records.hpp"

namespace ddprun::rdzv {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

TEST(JobKeysTest, KeysRoundTripThroughTheParser) {
  const jobs::JobKeys k("job-42", 3);
  EXPECT_EQ(k.round(7).node(1), "/ddprun/job-42/g3/r7/node/1");
  EXPECT_EQ(k.heartbeat("node0-host:12:5"), "/ddprun/job-42/g3/hb/node0-host:12:5");
  EXPECT_EQ(jobs::JobKeys::generation_counter("job-42"), "/ddprun/job-42/gen");
  const auto r = jobs::parse_key(k.round(7).node(1), nullptr);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->run_id, "job-42");
  EXPECT_EQ(r->generation, 3);
  EXPECT_EQ(r->round, 7);
  EXPECT_EQ(r->name, "node/1");
  const auto hb = jobs::parse_key(k.heartbeat("a:1"), nullptr);
  ASSERT_TRUE(hb);
  EXPECT_FALSE(hb->round);
  EXPECT_EQ(hb->name, "hb/a:1");
  const auto gen = jobs::parse_key("/ddprun/job-42/gen", nullptr);
  ASSERT_TRUE(gen);
  EXPECT_FALSE(gen->generation);
}

// The etcd backend lays the same keys out under its key_prefix; the status summary reads an
// agent's heartbeat time back by the name the launcher writes it under.
TEST(JobKeysTest, TheLayoutTakesAnotherRootAndNamesEveryGenerationKey) {
  const jobs::JobKeys k("job", 2, "/team-a/");
  EXPECT_EQ(jobs::JobKeys::generation_counter("job", "/team-a/"), "/team-a/job/gen");
  EXPECT_EQ(k.prefix(), "/team-a/job/g2/");
  EXPECT_EQ(k.round(1).members(), "/team-a/job/g2/r1/member/");
  EXPECT_EQ(k.current_round(), "/team-a/job/g2/current");
  EXPECT_EQ(k.ended(), "/team-a/job/g2/ended");
  EXPECT_EQ(k.left("a:1"), "/team-a/job/g2/left/a:1");
  EXPECT_EQ(k.left_all(), "/team-a/job/g2/left/");
  const jobs::JobKeys store("job", 2);
  EXPECT_EQ(store.heartbeat_time("a:1"), "/ddprun/job/g2/hb/a:1/time");
  const auto t = jobs::parse_key(store.heartbeat_time("a:1"), nullptr);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->name, jobs::heartbeat_time_name("a:1"));
  EXPECT_EQ(jobs::parse_key(store.done(), nullptr)->name, jobs::job_names::kDone);
}

TEST(JobKeysTest, OddKeysAreRejectedWithAReasonNeverAnException) {
  std::string why;
  EXPECT_FALSE(jobs::parse_key("/ddprun/x/g1/r99999999999999999999/node/0", &why));
  EXPECT_NE(why.find("not a number"), std::string::npos) << why;
  EXPECT_FALSE(jobs::parse_key("/ddprun/x/g-1/r0/end", &why));
  EXPECT_FALSE(jobs::parse_key("/ddprun/x/r0/node/0", &why));  // an older layout
  EXPECT_FALSE(jobs::parse_key("/ddprun/a b/gen", &why));
  EXPECT_NE(why.find("run id"), std::string::npos) << why;
  EXPECT_FALSE(jobs::parse_key("/default_pg/0", &why));
  EXPECT_FALSE(core::valid_run_id("a/b"));
  EXPECT_FALSE(core::valid_run_id(""));
  EXPECT_TRUE(core::valid_run_id("slurm-1234.step:0_x"));
}

TEST(JobKeysTest, EveryOutcomeKindSurvivesEncoding) {
  using Kind = jobs::Outcome::Kind;
  for (Kind kind : {Kind::Success, Kind::Failure, Kind::Signal, Kind::NodeLost, Kind::Membership, Kind::Hang}) {
    jobs::Outcome o;
    o.kind = kind;
    o.node = 2;
    o.detail = "what happened";
    if (kind == Kind::Failure || kind == Kind::Hang) o.failure = {{"rank", 5}, {"host", "h"}};
    const jobs::Outcome back = jobs::decode_outcome(jobs::encode_outcome(o));
    EXPECT_EQ(back.kind, kind) << jobs::encode_outcome(o);
    if (kind != Kind::Success && kind != Kind::Failure) {
      EXPECT_EQ(back.detail, "what happened");
    }
    if (kind == Kind::NodeLost || kind == Kind::Failure || kind == Kind::Hang) {
      EXPECT_EQ(back.node, 2);
    }
    if (kind == Kind::Failure || kind == Kind::Hang) {
      EXPECT_EQ(back.failure["rank"], 5);
    }
  }
  // Text that is no outcome reads as a failure that says what it was.
  const jobs::Outcome junk = jobs::decode_outcome("{not json");
  EXPECT_EQ(junk.kind, jobs::Outcome::Kind::Failure);
  EXPECT_EQ(junk.detail, "{not json");
}

TEST(JobKeysTest, SummaryListsJobsAndSkipsWhatItCannotParse) {
  const jobs::JobKeys k("job", 1);
  std::vector<std::pair<std::string, std::string>> kv = {
      {"/ddprun/job/gen", "1"},
      {k.round(0).node(0), R"({"host":"a","addr":"10.0.0.1","nproc":2,"nnodes":2,"agent":"x"})"},
      {k.round(0).node(1), R"({"host":"b","addr":"10.0.0.2","nproc":2,"nnodes":2,"agent":"y"})"},
      {k.round(0).complete(), "1"},
      {k.heartbeat("x"), "7"},
      {k.heartbeat("x") + "/time", "1000"},
      {k.round(1).node(0), "{bad json"},
      {k.round(1).end(), "lost:1:node 1 (b) sent no heartbeat for 15s"},
      {"/ddprun/other/g1/r99999999999999999999/node/0", "{}"},
  };
  const json s = daemon::summarize_jobs(kv, 3000);
  ASSERT_EQ(s["jobs"].size(), 1u) << s.dump(2);
  const json& job = s["jobs"][0];
  EXPECT_EQ(job["run_id"], "job");
  EXPECT_EQ(job["round"], 1);
  EXPECT_EQ(job["state"], "node_lost") << "a lost node is not a failure";
  EXPECT_EQ(job["end"], "node 1 (b) sent no heartbeat for 15s");
  ASSERT_EQ(s["skipped"].size(), 2u) << s.dump(2);
  EXPECT_EQ(s["skipped"][0]["key"], "/ddprun/other/g1/r99999999999999999999/node/0");
  EXPECT_EQ(s["skipped"][1]["key"], k.round(1).node(0));

  // Why the store refused a job's request is shown with the job, not as an odd key.
  kv.push_back({core::refusal_note("job"), "at 2026-11-24T05:10:05Z: job 'job' over its quota: ..."});
  kv.push_back({core::refusal_note("late"), "at 2026-11-24T05:10:06Z: store full: ..."});
  const json refused = daemon::summarize_jobs(kv, 3000);
  ASSERT_EQ(refused["jobs"].size(), 2u) << refused.dump(2);
  EXPECT_EQ(refused["skipped"].size(), 2u) << refused.dump(2);
  EXPECT_EQ(refused["jobs"][0]["store_refusal"], "at 2026-11-24T05:10:05Z: job 'job' over its quota: ...");
  EXPECT_EQ(refused["jobs"][1]["run_id"], "late");
  EXPECT_EQ(refused["jobs"][1]["state"], "refused");

  kv.resize(6);  // round 0 only: running, with heartbeats
  const json running = daemon::summarize_jobs(kv, 3000)["jobs"][0];
  EXPECT_EQ(running["state"], "running");
  EXPECT_EQ(running["world_size"], 4);
  EXPECT_EQ(running["nodes"][0]["heartbeats"], 7);
  EXPECT_DOUBLE_EQ(running["nodes"][0]["last_heartbeat_age_s"].get<double>(), 2.0);
}

// A flapping host's leaves (ddprun --max_unfit_leaves) are shown with its job: how often, and the
// last reason; a record that is not "<host>/<n>" is passed over.
TEST(JobSummaryTest, HostsThatLeftTheJobUnfitAreShownWithHowOftenAndTheLastReason) {
  const jobs::JobKeys k("job", 1);
  const std::vector<std::pair<std::string, std::string>> kv = {
      {"/ddprun/job/gen", "1"},
      {k.round(0).node(0), R"({"host":"a","addr":"10.0.0.1","nproc":1,"nnodes":1,"agent":"x"})"},
      {k.unfit("host-b", 1), "host-b:77:1\nfailed its health check: --node_check 'x' exited with 3"},
      {k.unfit("host-b", 2), "host-b:78:5\nwas asked by a worker to leave the job: flaky NIC"},
      {k.unfit("host-c", 1), "host-c:9:2\nfailed its health check: --check_gpus: GPU 1 does not answer"},
      {k.unfit("host-d", 0) + "x", "garbage"},
  };
  EXPECT_EQ(k.unfit("host-b", 2), "/ddprun/job/g1/unfit/host-b/2");
  const json job = daemon::summarize_jobs(kv, 0)["jobs"][0];
  ASSERT_TRUE(job.contains("left_unfit")) << job.dump(2);
  EXPECT_EQ(job["left_unfit"].size(), 2u) << job.dump(2);
  EXPECT_EQ(job["left_unfit"]["host-b"]["times"], 2);
  EXPECT_EQ(job["left_unfit"]["host-b"]["last"], "was asked by a worker to leave the job: flaky NIC");
  EXPECT_EQ(job["left_unfit"]["host-c"]["times"], 1);
}

// Status lists the keys, then reads them: a key deleted in between (a job ending, its agents
// cleaning up) reads empty. It is gone, not malformed: neither skipped nor counted.
TEST(JobSummaryTest, AKeyDeletedBetweenListingAndReadingIsGoneNotMalformed) {
  const jobs::JobKeys k("job", 1);
  const std::vector<std::pair<std::string, std::string>> kv = {
      {"/ddprun/job/gen", "1"},
      {k.round(0).node(0), R"({"host":"a","addr":"10.0.0.1","nproc":2,"nnodes":2,"agent":"x"})"},
      {k.round(0).node(1), ""},
      {k.round(0).worker_store(), ""},
      {k.round(0).complete(), "1"},
      {"/ddprun/gone/gen", ""},
      {"/ddprun/ft/ft/q/3", ""},
  };
  const json s = daemon::summarize_jobs(kv, 0);
  EXPECT_TRUE(s["skipped"].empty()) << s.dump(2);
  ASSERT_EQ(s["jobs"].size(), 1u) << s.dump(2);
  EXPECT_EQ(s["jobs"][0]["run_id"], "job");
  EXPECT_EQ(s["jobs"][0]["nodes"].size(), 1u) << s.dump(2);
  EXPECT_TRUE(s["fault_tolerant_jobs"].empty()) << s.dump(2);
}

// A replica group's worker store record carries the round's key, which lets whoever holds it seal
// values for the group's workers: status shows where the store is, never the key.
TEST(JobSummaryTest, AWorkerStoresRoundKeyIsNotShown) {
  const jobs::JobKeys k("job", 1);
  const std::string key(64, 'a');
  const std::vector<std::pair<std::string, std::string>> kv = {
      {"/ddprun/job/gen", "1"},
      {k.round(0).node(0), R"({"host":"a","addr":"10.0.0.1","nproc":2,"nnodes":1,"agent":"x"})"},
      {k.round(0).worker_store(), jobs::encode(jobs::WorkerStoreRecord{"10.0.0.1", 29500, key})},
      {k.round(0).complete(), "1"},
  };
  const json s = daemon::summarize_jobs(kv, 0);
  ASSERT_EQ(s["jobs"].size(), 1u) << s.dump(2);
  EXPECT_EQ(s["jobs"][0]["worker_store"], (json{{"addr", "10.0.0.1"}, {"port", 29500}})) << s.dump(2);
  EXPECT_EQ(s.dump().find(key), std::string::npos) << s.dump(2);
}

// A fault-tolerant job's quorum keys (/ddprun/<job>/ft/...) are the job's, not odd keys: status
// shows its groups, their heartbeats, the latest quorum kept and its end.
TEST(JobSummaryTest, AFaultTolerantJobsQuorumIsShownNotSkipped) {
  const std::vector<std::pair<std::string, std::string>> kv = {
      {"/ddprun/ft/ft/groups", "0,1,2,1,"},
      {"/ddprun/ft/ft/beat/0", "10.0.0.1:7:0 41"},
      {"/ddprun/ft/ft/beat/1", "gone"},
      {"/ddprun/ft/ft/ask/7/0", "{}"},
      {"/ddprun/ft/ft/latest", "7"},
      {"/ddprun/ft/ft/q/6", R"({"seq": 6, "id": 2, "members": [{"group": 0, "step": 5}]})"},
      {"/ddprun/ft/ft/q/7",
       R"({"seq": 7, "id": 3, "members": [{"group": 0, "step": 6}, {"group": 2, "step": 0}],
           "left_out": ["group 1 reports step 90, ...: left out"]})"},
  };
  json s = daemon::summarize_jobs(kv, 0);
  EXPECT_TRUE(s["skipped"].empty()) << s.dump(2);
  ASSERT_EQ(s["fault_tolerant_jobs"].size(), 1u) << s.dump(2);
  const json& job = s["fault_tolerant_jobs"][0];
  EXPECT_EQ(job["run_id"], "ft");
  EXPECT_EQ(job["state"], "training");
  ASSERT_EQ(job["groups"].size(), 3u);
  EXPECT_EQ(job["groups"][0]["world"], "ft.rg0");
  EXPECT_EQ(job["groups"][0]["incarnation"], "10.0.0.1:7:0");
  EXPECT_EQ(job["groups"][0]["heartbeats"], 41);
  EXPECT_EQ(job["groups"][1]["heartbeat"], "gone");
  EXPECT_FALSE(job["groups"][2].contains("heartbeats"));
  EXPECT_EQ(job["quorum"]["seq"], 7);
  EXPECT_EQ(job["quorum"]["id"], 3);
  EXPECT_EQ(job["quorum"]["max_step"], 6);
  EXPECT_EQ(job["quorum"]["members"].size(), 2u);
  EXPECT_EQ(job["quorum"]["left_out"][0], "group 1 reports step 90, ...: left out");
  // Its end, once recorded; a quorum record that cannot be read is skipped with the reason.
  auto ended = kv;
  ended.push_back({"/ddprun/ft/ft/finished", R"({"step": 81, "group": 0, "at": "2026-11-27T06:00:00.000Z"})"});
  ended.push_back({"/ddprun/ft/ft/q/8", "not json"});
  s = daemon::summarize_jobs(ended, 0);
  EXPECT_EQ(s["fault_tolerant_jobs"][0]["state"], "finished");
  EXPECT_EQ(s["fault_tolerant_jobs"][0]["finished"]["step"], 81);
  ASSERT_EQ(s["skipped"].size(), 1u) << s.dump(2);
  EXPECT_EQ(s["skipped"][0]["key"], "/ddprun/ft/ft/q/8");
}

std::vector<std::string> keys_of(const core::KvStore& s) { return s.list(); }

TEST(JobJanitorTest, DoneGenerationsGoAtOnceTheCounterAfterTheTtl) {
  core::KvStore store;
  const jobs::JobKeys g1("job", 1), g2("job", 2);
  store.set("/ddprun/job/gen", "2");
  store.set(g1.round(0).node(0), "{}");
  store.set(g1.done(), "1");
  store.set(g2.round(0).node(0), "{}");
  store.set("/default_pg/0", "not ours");
  server::JobJanitor janitor(10s);
  auto t = server::JobJanitor::Clock::now();
  EXPECT_EQ(janitor.sweep(store, t).generations_forgotten, 1u);
  EXPECT_EQ(keys_of(store), (std::vector<std::string>{"/ddprun/job/g2/r0/node/0", "/ddprun/job/gen", "/default_pg/0"}));
  store.set(g2.done(), "1");
  janitor.sweep(store, t + 1s);
  EXPECT_EQ(keys_of(store), (std::vector<std::string>{"/ddprun/job/gen", "/default_pg/0"}));
  janitor.sweep(store, t + 5s);
  EXPECT_EQ(store.num_keys(), 2u) << "the counter stays while a run might still read it";
  janitor.sweep(store, t + 12s);
  EXPECT_EQ(keys_of(store), (std::vector<std::string>{"/default_pg/0"}));
}

TEST(JobJanitorTest, AGenerationGoesOnlyAfterATtlWithoutAnyChange) {
  core::KvStore store;
  const jobs::JobKeys g("job", 1);
  store.set(g.round(0).node(0), "{}");
  store.set(g.heartbeat("a"), "1");
  server::JobJanitor janitor(10s);
  const auto t = server::JobJanitor::Clock::now();
  janitor.sweep(store, t);
  store.set(g.heartbeat("a"), "2");  // alive
  janitor.sweep(store, t + 8s);
  janitor.sweep(store, t + 16s);
  EXPECT_EQ(store.num_keys(), 2u) << "a heartbeat 8 s ago keeps it";
  EXPECT_EQ(janitor.sweep(store, t + 19s).generations_forgotten, 1u) << "11 s without a change";
  EXPECT_EQ(store.num_keys(), 0u);
}

// Keys a client wrote under a job's prefix that are no part of ddprun's layout (a buggy or hostile
// holder of the job's token): before, the janitor skipped them ("generation 'junk' is not a
// number") and they stayed for good, counted against the store's limits.
TEST(JobJanitorTest, StrayKeysUnderAJobsPrefixGoAfterATtlWithoutAnyChange) {
  core::KvStore store;
  store.set("/ddprun/job/junk", "x");
  store.set("/ddprun/job/g1x/r0/node/0", "y");
  store.set("/ddprun/job/g7/r0/n", "z");  // a round key ddprun never writes
  store.set("/ddprun/!bad id/x", "not a job's");
  server::JobJanitor janitor(10s);
  const auto t = server::JobJanitor::Clock::now();
  EXPECT_EQ(janitor.sweep(store, t).keys_deleted, 0u);
  store.set("/ddprun/job/junk", "x2");  // still being written
  janitor.sweep(store, t + 8s);
  EXPECT_EQ(store.num_keys(), 4u) << "a change 8 s ago keeps them";
  EXPECT_GE(janitor.sweep(store, t + 19s).keys_deleted, 2u);
  EXPECT_EQ(keys_of(store), (std::vector<std::string>{"/ddprun/!bad id/x"}));
}

std::vector<std::string>& logged() {
  static std::vector<std::string> lines;
  return lines;
}

// Before: a line per job forgotten, and the store's writers decide how many jobs there are
// (200,000 one-key jobs wrote 27 MB of log in one sweep). Now the first 8 are named, the rest
// counted in one line.
TEST(JobJanitorTest, StrayJobsForgottenInOneSweepAreNamedUpToEightThenCounted) {
  core::KvStore store;
  for (int i = 0; i < 100; ++i) store.set("/ddprun/j" + std::to_string(i) + "/x", "v");
  server::JobJanitor janitor(10s);
  const auto t = server::JobJanitor::Clock::now();
  janitor.sweep(store, t);
  logged().clear();
  log::set_sink([](std::string_view line) { logged().emplace_back(line); });
  const auto swept = janitor.sweep(store, t + 11s);
  log::set_sink(nullptr);
  EXPECT_EQ(swept.keys_deleted, 100u);
  EXPECT_EQ(store.num_keys(), 0u);
  ASSERT_EQ(logged().size(), 9u);
  EXPECT_NE(logged()[8].find("forgot 92 key(s) under 92 more jobs"), std::string::npos) << logged()[8];
}

}  // namespace
}  // namespace ddprun::rdzv
