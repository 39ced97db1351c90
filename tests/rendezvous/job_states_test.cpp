// The metrics' job states, kept as the store changes (daemon/job_states.hpp), against the reading
// of the whole store that `ddprun-rendezvous status` makes (summarize_jobs): the same figures
// after every change, for the rounds, ends and odd keys ddprun's jobs leave, and for a random walk
// over such keys.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/core/kv_store.hpp"
#include "rendezvous/daemon/job_states.hpp"
#include "rendezvous/daemon/job_summary.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::rdzv {
namespace {

using daemon::JobStates;
using jobs::JobKeys;
using jobs::Outcome;

// What /metrics said before: every key under /ddprun/ read and summarized.
std::map<std::string, int> by_reading_everything(const core::KvStore& store) {
  std::vector<std::pair<std::string, std::string>> entries;
  store.for_each(core::kRoot, [&](std::string_view k, const std::string& v) { entries.emplace_back(k, v); });
  std::map<std::string, int> by_state;
  for (const char* s : {"joining", "running", "succeeded", "failed", "stopped", "node_lost", "re-rendezvous", "hung"}) {
    by_state[s] = 0;
  }
  const auto summary = daemon::summarize_jobs(entries, 0);
  for (const auto& job : summary["jobs"]) ++by_state[job.value("state", "joining")];
  return by_state;
}

std::string end_of(Outcome::Kind kind) {
  Outcome o;
  o.kind = kind;
  o.detail = "why";
  return jobs::encode_outcome(o);
}

const std::string kNode = R"({"host":"h","nproc":2,"nnodes":1,"agent":"a"})";

TEST(JobStatesTest, EachStateIsCountedAsReadingTheWholeStoreCountsIt) {
  core::KvStore store;
  const JobStates states(store);
  auto same = [&](const char* after) {
    EXPECT_EQ(states.by_state(), by_reading_everything(store)) << "after " << after;
  };
  const JobKeys a("a", 1), b("b", 3), c("c", 1);
  store.set(JobKeys::generation_counter("a"), "1");
  same("a job's generation counter alone");
  store.set(a.heartbeat("agent0"), "1");
  same("a heartbeat: the run is joining");
  store.set(a.round(0).node(0), kNode);
  same("a node record");
  store.set(a.round(0).complete(), "1");
  same("a complete round: running");
  store.set(a.round(1).joined(), "1");
  same("the next round opened with a counter only");
  store.set(a.round(1).node(0), kNode);
  same("a node in the next round");
  store.set(a.round(1).end(), end_of(Outcome::Kind::Success));
  same("its end: succeeded");
  for (auto kind : {Outcome::Kind::Failure, Outcome::Kind::Signal, Outcome::Kind::NodeLost, Outcome::Kind::Membership,
                    Outcome::Kind::Hang}) {
    store.set(a.round(1).end(), end_of(kind));
    same("another end written over it");
  }
  store.set(b.round(5).member("0"), kNode);
  store.set(b.round(5).closed(), "{}");
  same("a dynamic round, closed");
  store.set(b.round(2).end(), "not an outcome at all");
  same("an earlier round's end that does not parse");
  store.set(core::refusal_note("c"), "at 2026: full");
  same("a job refused before its first round");
  store.set(c.round(0).node(0), kNode);
  same("the refused job's first round");
  store.set(c.round(0).end(), "");
  same("an empty end (a key deleted after it was listed)");
  store.append(c.round(0).end(), end_of(Outcome::Kind::Failure));
  same("the empty end appended to");
  store.set("/ddprun/a/ft/beat/0", "1 2");
  store.set("/ddprun/a/g1/r", "a round number missing");
  store.set("/ddprun/not a job/g1/r0/end", end_of(Outcome::Kind::Success));
  store.set("/elsewhere/g1/r0/end", end_of(Outcome::Kind::Success));
  same("a quorum's key, odd keys and another tool's");
  store.remove(a.round(1).node(0));
  same("the next round's node gone: the round before is read");
  store.remove(a.round(1).end());
  store.remove(a.round(1).joined());
  same("the next round gone");
  store.remove(core::refusal_note("c"));
  same("the refusal note gone");
  for (const std::string& k : store.list()) store.remove(k);
  same("every key gone");
  EXPECT_EQ(states.by_state().count("refused"), 0u);
}

TEST(JobStatesTest, WhatTheStoreHeldBeforeIsCounted) {
  core::KvStore store;
  const JobKeys a("a", 1);
  store.set(a.round(0).node(0), kNode);
  store.set(a.round(0).end(), end_of(Outcome::Kind::Hang));
  store.set(core::refusal_note("z"), "full");
  const JobStates states(store);
  EXPECT_EQ(states.by_state(), by_reading_everything(store));
  EXPECT_EQ(states.by_state().at("hung"), 1);
  EXPECT_EQ(states.by_state().at("refused"), 1);
}

// The store's own refusal note (a job over its quota) is counted as it appears.
TEST(JobStatesTest, AJobTheStoreRefusesIsCountedAsRefused) {
  core::StoreLimits limits;
  limits.max_job_keys = 2;
  core::KvStore store(limits);
  const JobStates states(store);
  const JobKeys q("q", 1);
  EXPECT_THROW(
      {
        for (int i = 0; i < 3; ++i) store.set(q.heartbeat("n" + std::to_string(i)), "1");
      },
      LimitError);
  EXPECT_EQ(states.by_state(), by_reading_everything(store));
}

// Random sets, appends and removals over the keys of a few jobs' runs and rounds.
TEST(JobStatesTest, ARandomWalkOverJobKeysAgreesAfterEveryChange) {
  core::KvStore store;
  const JobStates states(store);
  std::mt19937 rng(66);
  std::vector<std::string> keys;
  for (const char* run : {"j1", "j2"}) {
    keys.push_back(core::refusal_note(run));
    keys.push_back(JobKeys::generation_counter(run));
    for (int gen = 1; gen <= 2; ++gen) {
      const JobKeys k(run, gen);
      keys.push_back(k.heartbeat("x"));
      keys.push_back(k.done());
      for (int r = 0; r < 3; ++r) {
        for (const std::string& key : {k.round(r).node(0), k.round(r).member("1"), k.round(r).joined(),
                                       k.round(r).complete(), k.round(r).closed(), k.round(r).end()}) {
          keys.push_back(key);
        }
      }
    }
  }
  const std::vector<std::string> values = {
      "",    "1", kNode, end_of(Outcome::Kind::Success), end_of(Outcome::Kind::Failure), end_of(Outcome::Kind::Hang),
      "junk"};
  std::set<std::string> seen;
  for (int step = 0; step < 5000; ++step) {
    const std::string& key = keys[rng() % keys.size()];
    const std::string& value = values[rng() % values.size()];
    switch (rng() % 4) {
      case 0:
      case 1: store.set(key, value); break;
      case 2: store.append(key, value); break;
      case 3: store.remove(key); break;
    }
    const auto now = states.by_state();
    ASSERT_EQ(now, by_reading_everything(store)) << "step " << step << ": " << key;
    for (const auto& [state, n] : now) {
      if (n > 0) seen.insert(state);
    }
  }
  EXPECT_GE(seen.size(), 4u) << "the walk reached few states";
}

}  // namespace
}  // namespace ddprun::rdzv
