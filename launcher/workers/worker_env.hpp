#pragma once
// The environment of one worker: torchrun's contract (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...)
// laid over the launcher's own environment. Pure.

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher::workers {

using Environment = std::map<std::string, std::string>;

// Where one worker sits in the job.
struct WorkerPlacement {
  int local_rank = 0;
  int rank = 0;
  int local_world_size = 1;
  int world_size = 1;
  int group_rank = 0;        // node rank
  int group_world_size = 1;  // number of nodes
  int role_rank = 0;         // rank among the workers of this --role
  int role_world_size = 1;   // workers of this --role
};

// What every worker of one attempt shares.
struct AttemptContext {
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int round = 0;  // the job's rendezvous round (DDPRUN_ROUND)
  int max_restarts = 0;
  std::string run_id = "none";
  std::string role = "default";
  std::string signals_to_handle;  // "SIGTERM,SIGINT,..."
  // Visible GPU ids, when each worker gets exactly one (--virtual_local_rank), and the variable
  // that says so to the worker's runtime (HIP_VISIBLE_DEVICES on AMD, ZE_AFFINITY_MASK on Intel).
  std::optional<std::vector<std::string>> one_gpu_each;
  std::string gpu_variable = "CUDA_VISIBLE_DEVICES";
};

// The worker's full environment. `error_file` is its TORCHELASTIC_ERROR_FILE.
Environment worker_environment(const Environment& base, const WorkerPlacement& where, const AttemptContext& attempt,
                               const std::string& error_file);

// GPU ids visible to the launcher: the entries of `variable` (CUDA_VISIBLE_DEVICES,
// HIP_VISIBLE_DEVICES, ZE_AFFINITY_MASK), else 0..count-1.
std::vector<std::string> visible_gpu_ids(const Environment& base, int count,
                                         const std::string& variable = "CUDA_VISIBLE_DEVICES");

// Replaces ${local_rank} in each argument, as torchrun does.
std::vector<std::string> substitute_args(const std::vector<std::string>& args, int local_rank);

// The launcher's environment as a map.
Environment current_environment();

// KEY=VALUE strings for execve.
std::vector<std::string> to_envp(const Environment& env);

}  // namespace ddprun::launcher::workers
