#include "ddprun/worker/env.hpp"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include "launcher/workers/worker_env.hpp"

namespace ddprun::worker {
namespace {

WorkerEnv read(std::map<std::string, std::string> vars) {
  return WorkerEnv::from_lookup([vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    read(std::move(vars));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A launched worker's reading of the contract, with the master 10.0.0.1:29500, the agent's store and
// restart 2 that every test here gives it.
struct Layout {
  int rank, local_rank, world_size, local_world_size;
};
void expect_launched(const WorkerEnv& e, const Layout& x) {
  EXPECT_TRUE(e.launched);
  EXPECT_EQ(e.rank, x.rank);
  EXPECT_EQ(e.local_rank, x.local_rank);
  EXPECT_EQ(e.world_size, x.world_size);
  EXPECT_EQ(e.local_world_size, x.local_world_size);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_TRUE(e.use_agent_store);
  EXPECT_EQ(e.restart_count, 2);
}

// The contract, both sides: what ddprun sets for a worker is what the SDK reads back (one header
// names the variables for both: ddprun/worker/env_contract.hpp).
TEST(WorkerEnvTest, WhatTheLauncherSetsIsWhatTheSdkReads) {
  launcher::workers::WorkerPlacement where;
  where.local_rank = 1;
  where.rank = 5;
  where.local_world_size = 4;
  where.world_size = 8;
  where.group_rank = 1;
  where.group_world_size = 2;
  launcher::workers::AttemptContext attempt;
  attempt.master_addr = "10.0.0.1";
  attempt.master_port = 29500;
  attempt.restart_count = 2;
  attempt.round = 7;  // the job re-formed after restarts: its round is ahead of the restart count
  const auto env = launcher::workers::worker_environment({}, where, attempt, "/tmp/error.json");
  const WorkerEnv e = read(env);
  expect_launched(e, {.rank = 5, .local_rank = 1, .world_size = 8, .local_world_size = 4});
  EXPECT_EQ(e.round, 7);
}

TEST(WorkerEnvTest, NoLauncherVariablesMeansASingleProcess) {
  const WorkerEnv e = read({});
  EXPECT_FALSE(e.launched);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
}

TEST(WorkerEnvTest, ReadsTheFullContract) {
  const WorkerEnv e = read({{"RANK", "3"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_RANK", "1"},
                            {"LOCAL_WORLD_SIZE", "2"},
                            {"MASTER_ADDR", "10.0.0.1"},
                            {"MASTER_PORT", "29500"},
                            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                            {"TORCHELASTIC_RESTART_COUNT", "2"}});
  expect_launched(e, {.rank = 3, .local_rank = 1, .world_size = 8, .local_world_size = 2});
  EXPECT_EQ(e.round, 0) << "torchrun sets no DDPRUN_ROUND";
}

TEST(WorkerEnvTest, MissingOrMalformedVariablesAreNamed) {
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})
                .rfind("environment variable MASTER_PORT is not set; it is set by ddprun or torchrun", 0),
            0u);
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                .find("RANK='2' is not a whole number from 0 to 1"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "x"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}).find("WORLD_SIZE='x'"),
      std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"},
                      {"WORLD_SIZE", "1"},
                      {"MASTER_ADDR", "h"},
                      {"MASTER_PORT", "1"},
                      {"TORCHELASTIC_USE_AGENT_STORE", "True"}})
                .find("TORCHELASTIC_RESTART_COUNT is not set"),
            std::string::npos);
}

}  // namespace
}  // namespace ddprun::worker
