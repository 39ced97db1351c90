#pragma once
// The worker side of the launcher contract: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT, DDPRUN_ROUND. Works under
// ddprun, under torchrun, and with the variables set by hand. Pure (no Torch).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace ddprun::worker {

struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE == "True"
  int restart_count = 0;         // TORCHELASTIC_RESTART_COUNT
  int round = 0;                 // DDPRUN_ROUND (0 without it: torchrun, or by hand)
  bool launched = false;         // false: no launcher variables at all (a single process)

  using Lookup = std::function<std::optional<std::string>(const std::string&)>;

  // Reads the contract. With none of RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set it describes a
  // single process (world size 1). With some set, a missing or malformed variable throws
  // std::invalid_argument naming it and saying what sets it.
  static WorkerEnv from_lookup(const Lookup& env);
  static WorkerEnv from_environment();
};

}  // namespace ddprun::worker
