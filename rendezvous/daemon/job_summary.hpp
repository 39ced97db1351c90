#pragma once
// What `ddprun-rendezvous status` and the metrics endpoint know of the jobs on a store: read back
// from the keys rendezvous/jobs/job_keys.hpp lays out. Pure: no I/O.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::rdzv::daemon {

// Summary of every job found among `entries` (keys under /ddprun/ with their values), as
// `ddprun-rendezvous status` prints it:
//   {"jobs": [{"run_id", "generation", "current_generation", "round", "state", "nnodes", "joined",
//              "world_size", "nodes": [...], "worker_store", "end", "step_rates": [...],
//              "hang_diagnosed_by"}],
//    "skipped": [{"key", "reason"}],
//    "fault_tolerant_jobs": [{"run_id", "state": "training"|"finished"|"stopped", "groups": [{"group",
//              "world", "incarnation", "heartbeats"} or {"group", "world", "heartbeat": "gone"}],
//              "quorum": {"seq", "id", "max_step", "members": [{"group", "step"}], "left_out"},
//              "finished": {"step", "group", "at"}}]}
// A state is "joining", "running", or the final round's outcome (state_name). What cannot be
// parsed (a bad record, an odd key) is skipped and listed, never fatal; an empty value is a key
// deleted after it was listed, and is left out. `now_ms` (wall clock)
// gives heartbeat ages. A fault-tolerant job (ddprun --replica_group) is there twice: each group's
// world is a job of its own ("<job>.rg<N>", under "jobs"), and the quorum they share is under
// "fault_tolerant_jobs".
nlohmann::json summarize_jobs(const std::vector<std::pair<std::string, std::string>>& entries, int64_t now_ms);

}  // namespace ddprun::rdzv::daemon
