#pragma once
// `ddprun-rendezvous status`: what the jobs on a store look like, as JSON. Reads the keys the
// launcher's node rendezvous writes (rendezvous/jobs/job_keys.hpp) with LIST and MULTI_GET; what it
// cannot parse is listed under "skipped", never fatal.

#include <nlohmann/json.hpp>
#include <string>

#include "rendezvous/client/client.hpp"

namespace ddprun::rdzv::daemon {

// {"endpoint": ..., "keys": N, "jobs": [...], "skipped": [...]}; see jobs::summarize_jobs.
nlohmann::json store_status(client::Client& client);

}  // namespace ddprun::rdzv::daemon
