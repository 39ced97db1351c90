#pragma once
// The rendezvous keys of ddprun jobs on a store, in one place: how the launcher's node rendezvous
// names them, how a round's outcome is written, and how `ddprun-rendezvous status`, the metrics
// endpoint and the daemon's janitor read them back. Pure: no I/O.
//
//   /ddprun/<run_id>/gen                   the job id's current generation (decimal). Each run of a
//                                          job id is a generation of its own, so a job id can be
//                                          run again on a shared daemon
//   /ddprun/<run_id>/g<G>/current          dynamic jobs: the round a newly started node joins
//   /ddprun/<run_id>/g<G>/hb/<agent>       an agent's heartbeat counter; "<...>/time" its wall-clock
//                                          time in ms (for status only: clocks need not agree)
//   /ddprun/<run_id>/g<G>/ended            the job's final outcome (set by the first node to leave)
//   /ddprun/<run_id>/g<G>/exited           how many nodes have read the outcome and left
//   /ddprun/<run_id>/g<G>/done             every node has left: the generation can be forgotten
//   /ddprun/<run_id>/g<G>/r<R>/<name>      round R (a restart or a membership change starts the
//                                          next): node/<K> (static) or member/<i> (dynamic) records,
//                                          joined, assign/<K>, complete or closed, worker_store,
//                                          end (the round's outcome), finished; and the hang
//                                          watchdog's: progress (a counter every node bumps when
//                                          its ranks progress), heartbeat_mode, rates/<K> (node
//                                          K's step rates), hang (the node diagnosing a hang),
//                                          diagnosis/<K> (node K's part of the diagnosis)
//
// Run ids are letters, digits and ". _ - :" (no '/'), so a key names its job unambiguously.

#include <cstdint>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddprun::rdzv::jobs {

inline constexpr std::string_view kRoot = "/ddprun/";

// Whether `run_id` can name a job; `why` says what is wrong otherwise.
bool valid_run_id(std::string_view run_id, std::string* why = nullptr);

// The keys of one generation of one job.
class JobKeys {
 public:
  JobKeys(std::string run_id, int64_t generation);
  const std::string& run_id() const { return run_id_; }
  int64_t generation() const { return generation_; }

  // /ddprun/<run_id>/gen
  static std::string generation_counter(std::string_view run_id);
  // /ddprun/<run_id>/
  static std::string job_prefix(std::string_view run_id);

  std::string prefix() const { return prefix_; }  // /ddprun/<run_id>/g<G>/
  std::string round(int64_t round, std::string_view name) const;
  std::string heartbeat(std::string_view agent) const;
  std::string current_round() const { return prefix_ + "current"; }
  std::string ended() const { return prefix_ + "ended"; }
  std::string exited() const { return prefix_ + "exited"; }
  std::string done() const { return prefix_ + "done"; }

 private:
  std::string run_id_;
  int64_t generation_;
  std::string prefix_;
};

// A key under /ddprun/, taken apart.
struct ParsedKey {
  std::string run_id;
  std::optional<int64_t> generation;  // absent for /ddprun/<run_id>/gen
  std::optional<int64_t> round;       // present for round keys
  std::string name;                   // "gen", "current", "hb/node0", "node/1", "end", ...
};

// nullopt (with `why`) for a key that is not in the layout above: another tool's key, a round
// number too large for 64 bits, ...
std::optional<ParsedKey> parse_key(std::string_view key, std::string* why);

// How a round (or a job) ended.
struct Outcome {
  enum class Kind {
    Success,     // every worker of every node exited 0
    Failure,     // a worker failed; `failure` is the root cause as its node reported it
    Signal,      // ddprun on some node was stopped by a signal
    NodeLost,    // a node stopped heartbeating (`node`: its group rank)
    Membership,  // a node asked to join a running elastic job: re-rendezvous
    Hang,        // no rank made progress for --hang_timeout; `failure` describes the diagnosis
  };
  Kind kind = Kind::Success;
  std::string detail;        // human-readable
  int node = -1;             // NodeLost: the lost node; Failure/Hang: the node that reported it
  nlohmann::json failure;    // Failure, Hang: a JSON object
};

// The value written to an `end` key.
std::string encode_outcome(const Outcome& outcome);
// Never throws: text that is not an outcome reads as a Failure whose detail is the text.
Outcome decode_outcome(std::string_view text);
// "succeeded", "failed", "stopped", "node_lost", "re-rendezvous", "hung".
std::string_view state_name(Outcome::Kind kind);

// Summary of every job found among `entries` (keys under /ddprun/ with their values), as
// `ddprun-rendezvous status` prints it:
//   {"jobs": [{"run_id", "generation", "current_generation", "round", "state", "nnodes", "joined",
//              "world_size", "nodes": [...], "worker_store", "end", "step_rates": [...],
//              "hang_diagnosed_by"}],
//    "skipped": [{"key", "reason"}]}
// A state is "joining", "running", or the final round's outcome (state_name). What cannot be
// parsed (a bad record, an odd key) is skipped and listed, never fatal. `now_ms` (wall clock)
// gives heartbeat ages.
nlohmann::json summarize_jobs(const std::vector<std::pair<std::string, std::string>>& entries, int64_t now_ms);

}  // namespace ddprun::rdzv::jobs
