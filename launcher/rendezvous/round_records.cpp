#include "launcher/rendezvous/round_records.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/json_fields.hpp"
#include "common/numbers.hpp"
#include "common/system.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::launcher::rendezvous {

using workers::describe_exit;
using workers::WorkerExit;

using json = nlohmann::json;

std::string failure_sentence(const WorkerExit& failure, int node) {
  const std::string where = node < 0 ? "" : " on node " + std::to_string(node) + " (" + failure.host + ")";
  return "rank " + std::to_string(failure.rank) + where + " failed with " + describe_exit(failure);
}

rdzv::jobs::Outcome failure_outcome(const WorkerExit& failure, int node, const ProgressMark& progress) {
  rdzv::jobs::Outcome o;
  o.kind = rdzv::jobs::Outcome::Kind::Failure;
  o.node = node;
  o.failure = exit_to_json(failure, node);
  if (progress.iterations) {
    o.failure["progress"] = {{"iterations", *progress.iterations},
                             {"no_progress_restarts", progress.no_progress_restarts}};
  }
  return o;
}

namespace {

// The progress a failure's node reported; nothing for a malformed or absent "progress".
ProgressMark progress_from_json(const json& failure) {
  ProgressMark m;
  const auto it = failure.find("progress");
  if (it == failure.end() || !it->is_object()) return m;
  const auto n = it->find("iterations");
  if (n == it->end() || !n->is_number_unsigned()) return m;
  m.iterations = n->get<uint64_t>();
  m.no_progress_restarts = static_cast<int>(std::clamp<int64_t>(int_field(*it, "no_progress_restarts", 0), 0, 1 << 20));
  return m;
}

}  // namespace

rdzv::jobs::Outcome hang_outcome(const std::string& summary, const std::string& report, int node) {
  rdzv::jobs::Outcome o;
  o.kind = rdzv::jobs::Outcome::Kind::Hang;
  o.node = node;
  o.detail = summary;
  o.failure = {{"report", report}};
  return o;
}

rdzv::jobs::Outcome signal_outcome(int signo, int node, const std::string& host) {
  rdzv::jobs::Outcome o;
  o.kind = rdzv::jobs::Outcome::Kind::Signal;
  o.detail = signal_name(signo) + (node >= 0 ? " on node " + std::to_string(node) + " (" + host + ")" : " on " + host);
  return o;
}

json exit_to_json(const WorkerExit& e, int node) {
  json j = {{"node", node},
            {"host", e.host},
            {"rank", e.rank},
            {"local_rank", e.local_rank},
            {"pid", e.pid},
            {"exit_code", e.exit_code},
            {"signal", e.signal},
            {"error_file", e.error_file},
            {"stderr_tail", e.stderr_tail},
            {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(e.time.time_since_epoch()).count()}};
  if (e.error_text) j["error"] = *e.error_text;
  if (!e.diagnosis.empty()) j["diagnosis"] = e.diagnosis;
  return j;
}

WorkerExit exit_from_json(const json& j) {
  WorkerExit e;
  e.host = string_field(j, "host");
  e.node_rank = static_cast<int>(int_field(j, "node", -1));
  e.rank = static_cast<int>(int_field(j, "rank", 0));
  e.local_rank = static_cast<int>(int_field(j, "local_rank", 0));
  e.pid = static_cast<pid_t>(int_field(j, "pid", 0));
  e.exit_code = static_cast<int>(int_field(j, "exit_code", 0));
  e.signal = static_cast<int>(int_field(j, "signal", 0));
  e.error_file = string_field(j, "error_file");
  e.stderr_tail = strings_field(j, "stderr_tail");
  e.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(int_field(j, "time_ms", 0)));
  if (j.contains("error") && j["error"].is_string()) e.error_text = j["error"].get<std::string>();
  e.diagnosis = string_field(j, "diagnosis");
  return e;
}

namespace {

[[noreturn]] void malformed(const std::string& key, const std::string& value, const char* what) {
  throw ProtocolError("the rendezvous key " + key + " does not hold " + what + " (" + std::to_string(value.size()) +
                      " bytes: '" + value.substr(0, 60) +
                      "'); was it written by another program, or another "
                      "version of ddprun?");
}

}  // namespace

rdzv::jobs::NodeRecord read_node_record(const std::string& key, const std::string& value) {
  if (auto r = rdzv::jobs::decode_node_record(value)) return *r;
  malformed(key, value, "a node record (a JSON object)");
}

rdzv::jobs::WorkerStoreRecord read_worker_store(const std::string& key, const std::string& value) {
  if (auto r = rdzv::jobs::decode_worker_store(value)) return *r;
  malformed(key, value, "the worker store's address (a JSON object with addr and a port in 1-65535)");
}

rdzv::jobs::Assignment read_assignment(const std::string& key, const std::string& value) {
  if (auto r = rdzv::jobs::decode_assignment(value)) return *r;
  malformed(key, value, "an assignment (a JSON object with group_rank, group_world_size, offset and world_size)");
}

rdzv::jobs::ClosedRound read_closed_round(const std::string& key, const std::string& value) {
  if (auto r = rdzv::jobs::decode_closed_round(value)) return *r;
  malformed(key, value, "a closed round (a JSON object with a members array of node records)");
}

int64_t read_number(const std::string& key, const std::string& value) {
  if (auto n = to_int(value)) return *n;
  malformed(key, value, "a number");
}

RoundEnd parse_round_end(const std::string& value) {
  using Kind = rdzv::jobs::Outcome::Kind;
  const rdzv::jobs::Outcome o = rdzv::jobs::decode_outcome(value);
  RoundEnd e;
  e.detail = o.detail;
  e.root_node = o.node;
  switch (o.kind) {
    case Kind::Success: e.kind = RoundEnd::Kind::Success; break;
    case Kind::Signal: e.kind = RoundEnd::Kind::Signal; break;
    case Kind::Membership: e.kind = RoundEnd::Kind::Membership; break;
    case Kind::NodeLost: e.kind = RoundEnd::Kind::NodeLost; break;
    case Kind::Hang:
      e.kind = RoundEnd::Kind::Hang;
      if (auto it = o.failure.find("report"); it != o.failure.end() && it->is_string())
        e.report = it->get<std::string>();
      break;
    case Kind::Failure:
      e.kind = RoundEnd::Kind::Failure;
      if (!o.failure.empty()) {
        e.root_cause = exit_from_json(o.failure);
        e.detail = failure_sentence(*e.root_cause, e.root_node);
        e.progress = progress_from_json(o.failure);
      }
      break;
  }
  return e;
}

}  // namespace ddprun::launcher::rendezvous
