#pragma once
// What ddprun knows about a hung job, gathered from every node, and the report made of it: which
// ranks are behind (the ones the others wait for), where every rank is (its Python tracebacks and
// native frames), what the worker store saw (who waits for which key, who never connected).
// Pure: the data comes from the watchdogs (watchdog.hpp); nodes exchange it as JSON.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher::watchdog {

// One rank when the hang was diagnosed.
struct RankState {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool exited = false;
  std::string state;  // "sleeping", "running", ...
  std::string wchan;  // kernel wait function of its main thread
  double cpu_seconds = 0;
  bool reports_progress = false;  // uses the progress page (worker SDK)
  uint64_t steps = 0;
  bool in_collective = false;  // inside a CollectiveWait when diagnosed
  double idle_seconds = 0;     // since its last progress
  // Local endpoints of its connections to the worker store ("10.0.0.2:41234").
  std::vector<std::string> store_endpoints;
  std::string python_stack;
  std::string native_stack;
  std::string native_tool;
  std::vector<std::string> problems;
  std::string stack_file;  // where its full stacks were written on its host
};

// A client of the worker store with a pending WAIT.
struct StoreWait {
  std::string peer;               // the client's endpoint as the store sees it
  std::vector<std::string> keys;  // still missing
  double seconds = 0;
};

// What the worker store saw (on the node that hosts it).
struct StoreView {
  std::string endpoint;
  std::vector<StoreWait> waits;
  std::vector<std::string> clients;   // every connected client's endpoint
  std::map<int, int64_t> heartbeats;  // rank -> its heartbeat counter (ddprun/progress/<rank>)
};

struct NodeDiagnosis {
  int node = -1;  // group rank; -1 for a single-node job
  std::string host;
  std::string log_dir;
  std::vector<RankState> ranks;
  std::optional<StoreView> store;
};

struct HangDiagnosis {
  std::string program;
  std::chrono::milliseconds timeout{0};
  double idle_seconds = 0;  // since the job's last progress
  int detector_node = -1;
  std::string detector_host;
  std::chrono::system_clock::time_point detected_at;
  std::vector<NodeDiagnosis> nodes;
  std::vector<int> silent_nodes;  // nodes whose diagnosis did not arrive in time
};

nlohmann::json to_json(const NodeDiagnosis& d);
// Never throws: fields that are missing or of the wrong type read as defaults.
NodeDiagnosis node_diagnosis_from_json(const nlohmann::json& j);

// The findings: which ranks the others wait for, and the facts that show it, one per line.
struct HangFindings {
  std::vector<int> behind;
  std::vector<std::string> facts;
};
HangFindings analyze_hang(const HangDiagnosis& d);

// Where a rank is: rank_location (hang_frames.hpp).

// The report printed when a hang ends the job (and written to the run directory).
std::string format_hang_report(const HangDiagnosis& d);

// One line for logs and the rendezvous outcome: "no rank made progress for 31 s; ranks behind: 1".
std::string hang_summary(const HangDiagnosis& d);

}  // namespace ddprun::launcher::watchdog
