#pragma once
// `ddprun-rendezvous status`: what the jobs on a store look like, as JSON. Reads the keys the
// launcher's node rendezvous writes (/ddprun/<run_id>/r<round>/...) with LIST and MULTI_GET.

#include <nlohmann/json.hpp>
#include <string>

#include "rendezvous/client.hpp"

namespace ddprun::rdzv {

// {"endpoint": ..., "keys": N, "jobs": [{"run_id", "round", "state", "nnodes", "joined", "nodes": [...],
//   "world_size", "worker_store", "end"}]}
nlohmann::json store_status(Client& client);

}  // namespace ddprun::rdzv
