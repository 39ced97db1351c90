#pragma once
// The values rendezvous backends keep (a node's record, an assignment, a failure's root cause) and
// the checked way to read them: whatever comes from a store or from etcd was written by another
// process, possibly another version, so nothing here throws a library's exception. A value that is
// required and malformed is a ProtocolError naming its key; a field of the wrong type reads as the
// fallback.

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/system.hpp"                           // seconds_text
#include "launcher/rendezvous/rendezvous_backend.hpp"  // RoundEnd
#include "launcher/workers/worker_exit.hpp"
#include "rendezvous/jobs/job_keys.hpp"
#include "common/json_fields.hpp"
#include "rendezvous/jobs/records.hpp"

namespace ddprun::launcher::rendezvous {

using workers::WorkerExit;

// The round's records (rendezvous/jobs/records.hpp) read from `key`, or a ProtocolError that
// names the key, says what it should hold and shows the start of the value.
rdzv::jobs::NodeRecord read_node_record(const std::string& key, const std::string& value);
rdzv::jobs::WorkerStoreRecord read_worker_store(const std::string& key, const std::string& value);
rdzv::jobs::Assignment read_assignment(const std::string& key, const std::string& value);
rdzv::jobs::ClosedRound read_closed_round(const std::string& key, const std::string& value);
// A decimal number read from `key`, or a ProtocolError that names the key.
int64_t read_number(const std::string& key, const std::string& value);

// A failure's root cause as one node reports it to the others, and back.
nlohmann::json exit_to_json(const WorkerExit& e, int node);
WorkerExit exit_from_json(const nlohmann::json& j);
// A round's end as written to its `end` key (rdzv::jobs::encode_outcome).
RoundEnd parse_round_end(const std::string& value);

// The outcomes a node reports for its round, whatever the backend: a worker's failure (the root
// cause), and a stop signal received on `host` (node -1: a job of one node).
// `progress` travels with the failure ("progress" in its object) for every node's restart policy.
rdzv::jobs::Outcome failure_outcome(const WorkerExit& failure, int node, const ProgressMark& progress = {});
// The one line that says which worker failed and how: "rank 3 failed with exit code 6" on one
// node, "rank 3 on node 1 (host-b) failed with exit code 6" on several (`node` >= 0).
std::string failure_sentence(const WorkerExit& failure, int node);
rdzv::jobs::Outcome signal_outcome(int signo, int node, const std::string& host);
// A hang diagnosed by `node`: `summary` is the one line, `report` the full report.
rdzv::jobs::Outcome hang_outcome(const std::string& summary, const std::string& report, int node);

}  // namespace ddprun::launcher::rendezvous
