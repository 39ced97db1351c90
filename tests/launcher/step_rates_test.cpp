// Step rates and stragglers (launcher/watchdog/step_rates).
#include <gtest/gtest.h>

#include "launcher/watchdog/step_rates.hpp"
#include "rendezvous/jobs/job_keys.hpp"
#include "rendezvous/daemon/job_summary.hpp"

namespace ddprun::launcher {

using watchdog::format_rates_table;
using watchdog::rank_rate_from_json;
using watchdog::RankRate;
using watchdog::RateTracker;
using watchdog::slower_than_median;
using watchdog::StragglerWatch;
using watchdog::to_json;
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST(StepRatesTest, ComputeTimePerStepIsWallTimeMinusWaitsOverTheWindow) {
  RateTracker t;
  const auto t0 = std::chrono::steady_clock::time_point{} + 100s;
  t.sample(t0, 100, 0, true);
  t.sample(t0 + 10s, 200, 4'000'000'000ULL, true);  // 100 steps in 10 s, 4 s of them waiting
  const auto w = t.window(3, 1);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->steps, 100u);
  EXPECT_DOUBLE_EQ(w->steps_per_second, 10.0);
  ASSERT_TRUE(w->compute_ms_per_step);
  EXPECT_NEAR(*w->compute_ms_per_step, 60.0, 1e-9);
  EXPECT_NEAR(w->wait_fraction, 0.4, 1e-9);
  EXPECT_FALSE(t.window(3, 1)) << "no new steps since the last window";
  t.sample(t0 + 20s, 300, 4'000'000'000ULL, true);
  const auto run = t.whole_run(3, 1);
  ASSERT_TRUE(run);
  EXPECT_EQ(run->steps, 300u);
  EXPECT_DOUBLE_EQ(run->steps_per_second, 10.0);
}

TEST(StepRatesTest, AStragglerIsFlaggedAfterThreeSlowWindowsAndOnlyOnce) {
  auto window = [](double slow_ms) {
    std::vector<RankRate> w;
    for (int r = 0; r < 4; ++r) {
      RankRate x;
      x.rank = r;
      x.steps = 10;
      x.steps_per_second = 5;
      x.compute_ms_per_step = r == 2 ? slow_ms : 100.0 + r;
      w.push_back(x);
    }
    return w;
  };
  EXPECT_EQ(slower_than_median(window(300), 1.5), std::vector<int>{2});
  EXPECT_TRUE(slower_than_median(window(140), 1.5).empty());
  StragglerWatch watch(1.5, 3);
  EXPECT_TRUE(watch.update(window(300)).empty());
  EXPECT_TRUE(watch.update(window(300)).empty());
  const auto warnings = watch.update(window(300));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("rank 2 is a straggler: 300.0 ms of compute per step against 101.0 ms"), std::string::npos)
      << warnings[0];
  EXPECT_TRUE(watch.update(window(300)).empty()) << "warned once";
  // A slow window that is not persistent warns nobody.
  StragglerWatch other(1.5, 3);
  other.update(window(300));
  other.update(window(100));
  EXPECT_TRUE(other.update(window(300)).empty());
  const std::string table = format_rates_table(window(300), watch.flagged());
  EXPECT_NE(table.find("<- straggler"), std::string::npos) << table;
  EXPECT_EQ(table.find("<- straggler"), table.rfind("<- straggler")) << table;
}

TEST(StepRatesTest, TwoRanksCompareWithTheFasterAndRatesSurviveJson) {
  RankRate a, b;
  a.rank = 0;
  a.steps_per_second = 10;
  b.rank = 1;
  b.steps_per_second = 4;  // heartbeat-only ranks: rates, no compute figures
  EXPECT_EQ(slower_than_median({a, b}, 1.5), std::vector<int>{1});
  b.compute_ms_per_step = 12.5;
  b.node = 2;
  const auto back = rank_rate_from_json(to_json(b));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->node, 2);
  EXPECT_DOUBLE_EQ(*back->compute_ms_per_step, 12.5);
  EXPECT_FALSE(rank_rate_from_json(nlohmann::json::parse(R"({"rank":1})")));
}

TEST(StepRatesTest, StatusShowsEachNodesLatestRates) {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"/ddprun/j/gen", "1"},
      {"/ddprun/j/g1/r0/node/0", R"({"host":"a","nproc":1,"nnodes":2,"agent":"x"})"},
      {"/ddprun/j/g1/r0/complete", "1"},
      {"/ddprun/j/g1/r0/rates/0", R"({"node":0,"ranks":[{"rank":0,"steps_per_s":4.5}]})"},
      {"/ddprun/j/g1/r0/rates/1", "not json"},
      {"/ddprun/j/g1/r0/hang", "1"},
  };
  const auto job = rdzv::daemon::summarize_jobs(kv, 0)["jobs"][0];
  ASSERT_TRUE(job.contains("step_rates")) << job.dump();
  EXPECT_EQ(job["step_rates"][0]["steps_per_s"], 4.5);
  EXPECT_EQ(job["hang_diagnosed_by"], "1");
}

// --- /proc --------------------------------------------------------------------------------------

}  // namespace
}  // namespace ddprun::launcher
