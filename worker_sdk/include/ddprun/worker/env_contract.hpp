#pragma once
// The worker environment contract, named once: the variables ddprun sets for each worker (torchrun's,
// and ddprun's own) and the SDK reads. The launcher (launcher/workers/worker_env.cpp,
// launcher/agent/agent_launches.cpp) and the SDK (src/env.cpp, src/progress.cpp) both spell them
// from here. Torch-free; docs/guide.md lists them for users.

namespace ddprun::worker::env_names {

// torchrun's.
inline constexpr const char kRank[] = "RANK";
inline constexpr const char kLocalRank[] = "LOCAL_RANK";
inline constexpr const char kGroupRank[] = "GROUP_RANK";
inline constexpr const char kRoleRank[] = "ROLE_RANK";
inline constexpr const char kRoleName[] = "ROLE_NAME";
inline constexpr const char kWorldSize[] = "WORLD_SIZE";
inline constexpr const char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr const char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr const char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr const char kMasterAddr[] = "MASTER_ADDR";
inline constexpr const char kMasterPort[] = "MASTER_PORT";
inline constexpr const char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr const char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";  // "True" or absent
inline constexpr const char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char kSignalsToHandle[] = "TORCHELASTIC_SIGNALS_TO_HANDLE";
inline constexpr const char kTimerFile[] = "TORCHELASTIC_TIMER_FILE";

// ddprun's own.
// The job's rendezvous round this attempt runs in: 0 the first; more after a restart, a node lost
// or admitted (torchrun's TORCHELASTIC_RESTART_COUNT counts only restarts), or a node's rerun.
inline constexpr const char kRound[] = "DDPRUN_ROUND";
inline constexpr const char kProgressFile[] = "DDPRUN_PROGRESS_FILE";  // the rank's progress page
inline constexpr const char kStackDir[] = "DDPRUN_STACK_DIR";          // where the rank writes its stacks
inline constexpr const char kStackSignal[] = "DDPRUN_STACK_SIGNAL";    // the signal that asks for them
// A file a worker writes (a line: why) to ask that its node leave the job before the next round.
inline constexpr const char kExcludeNodeFile[] = "DDPRUN_EXCLUDE_NODE_FILE";

}  // namespace ddprun::worker::env_names
