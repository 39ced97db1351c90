#pragma once
// The rendezvous keys of ddprun jobs, in one place: how the launcher's node rendezvous names them
// (on a store, and on etcd under its key_prefix instead of /ddprun/), how a round's outcome is
// written, and how `ddprun-rendezvous status`, the metrics endpoint and the daemon's janitor read
// them back. Every key is built here: no other file spells a name of the layout. Pure: no I/O.
//
//   /ddprun/<run_id>/gen                   the job id's current generation (decimal). Each run of a
//                                          job id is a generation of its own, so a job id can be
//                                          run again on a shared daemon
//   /ddprun/<run_id>/g<G>/current          dynamic jobs: the round a newly started node joins
//   /ddprun/<run_id>/g<G>/hb/<agent>       an agent's heartbeat counter; "<...>/time" its wall-clock
//                                          time in ms (for status only: clocks need not agree)
//   /ddprun/<run_id>/g<G>/left/<agent>     etcd: the agents that have read the outcome and left
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
// Run ids are letters, digits and ". _ - :" (no '/'), so a key names its job unambiguously
// (rendezvous/core/job_namespace.hpp: what the store itself knows of a job's namespace).

#include <cstdint>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rendezvous/core/job_namespace.hpp"

namespace ddprun::rdzv::jobs {

// The names under a job's prefix and a generation's.
namespace job_names {
inline constexpr std::string_view kGeneration = "gen";       // the job id's current generation
inline constexpr std::string_view kCurrent = "current";      // dynamic jobs: the round to join
inline constexpr std::string_view kHeartbeat = "hb/";        // an agent's heartbeat counter
inline constexpr std::string_view kHeartbeatTime = "/time";  // after hb/<agent>: its wall-clock time
inline constexpr std::string_view kEnded = "ended";          // the job's final outcome
inline constexpr std::string_view kExited = "exited";        // store: nodes that read it and left
inline constexpr std::string_view kLeft = "left/";           // etcd: an agent that read it and left
inline constexpr std::string_view kDone = "done";            // every node has left
inline constexpr std::string_view kUnfit = "unfit/";         // a host's leaves unfit: unfit/<host>/<n>
}  // namespace job_names

// The names under a round's prefix, in one place: what the launcher's two backends write and what
// `ddprun-rendezvous status` reads back. Names that end in '/' take a node, an arrival or an
// agent after them.
namespace round_names {
inline constexpr std::string_view kNode = "node/";         // static jobs: node K's record
inline constexpr std::string_view kMember = "member/";     // dynamic jobs: a member's record
inline constexpr std::string_view kAssign = "assign/";     // a member's assignment (store)
inline constexpr std::string_view kJoined = "joined";      // arrivals counter (store)
inline constexpr std::string_view kComplete = "complete";  // a static round is full (store)
inline constexpr std::string_view kClosed = "closed";      // a dynamic round's membership
inline constexpr std::string_view kWorkerStore = "worker_store";
inline constexpr std::string_view kEnd = "end";               // the round's outcome
inline constexpr std::string_view kFinished = "finished";     // nodes that finished (store: counter)
inline constexpr std::string_view kFinishedBy = "finished/";  // nodes that finished (etcd: one key each)
inline constexpr std::string_view kProgress = "progress";     // job-wide progress counter (store)
inline constexpr std::string_view kProgressOf = "progress/";  // a node's progress counter (etcd)
inline constexpr std::string_view kHeartbeatMode = "heartbeat_mode";
inline constexpr std::string_view kRates = "rates/";          // a node's step rates
inline constexpr std::string_view kHang = "hang";             // the node diagnosing a hang
inline constexpr std::string_view kDiagnosis = "diagnosis/";  // a node's part of the diagnosis
}  // namespace round_names

// A prefix and the keys named under it: "<prefix><name><suffix>".
class KeysUnder {
 public:
  const std::string& prefix() const { return prefix_; }

 protected:
  explicit KeysUnder(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string at(std::string_view name, std::string_view suffix = {}) const {
    std::string k = prefix_;
    k.append(name).append(suffix);
    return k;
  }

 private:
  std::string prefix_;
};

// The keys of one round under its prefix (".../g<G>/r<R>/"), named: a typo is a compile error.
class RoundKeys : public KeysUnder {
 public:
  explicit RoundKeys(std::string prefix) : KeysUnder(std::move(prefix)) {}

  std::string node(int k) const { return at(round_names::kNode, std::to_string(k)); }
  std::string nodes() const { return at(round_names::kNode); }
  std::string member(std::string_view id) const { return at(round_names::kMember, id); }
  std::string members() const { return at(round_names::kMember); }
  std::string assign(std::string_view id) const { return at(round_names::kAssign, id); }
  std::string joined() const { return at(round_names::kJoined); }
  std::string complete() const { return at(round_names::kComplete); }
  std::string closed() const { return at(round_names::kClosed); }
  std::string worker_store() const { return at(round_names::kWorkerStore); }
  std::string end() const { return at(round_names::kEnd); }
  std::string finished() const { return at(round_names::kFinished); }
  std::string finished_by(std::string_view agent) const { return at(round_names::kFinishedBy, agent); }
  std::string finished_all() const { return at(round_names::kFinishedBy); }
  std::string progress() const { return at(round_names::kProgress); }
  std::string progress_of(int node) const { return at(round_names::kProgressOf, std::to_string(node)); }
  std::string progress_all() const { return at(round_names::kProgressOf); }
  std::string heartbeat_mode() const { return at(round_names::kHeartbeatMode); }
  std::string rates(int node) const { return at(round_names::kRates, std::to_string(node)); }
  std::string rates_all() const { return at(round_names::kRates); }
  std::string hang() const { return at(round_names::kHang); }
  std::string diagnosis(int node) const { return at(round_names::kDiagnosis, std::to_string(node)); }
  std::string diagnoses() const { return at(round_names::kDiagnosis); }
};

// The keys of one generation of one job, under `root` (/ddprun/ on a store; the etcd backend's
// key_prefix there).
class JobKeys : public KeysUnder {
 public:
  JobKeys(std::string run_id, int64_t generation, std::string_view root = core::kRoot);
  const std::string& run_id() const { return run_id_; }
  int64_t generation() const { return generation_; }

  // <root><run_id>/gen
  static std::string generation_counter(std::string_view run_id, std::string_view root = core::kRoot);

  // prefix(): <root><run_id>/g<G>/
  RoundKeys round(int64_t round) const;
  std::string heartbeat(std::string_view agent) const;
  std::string heartbeat_time(std::string_view agent) const;
  std::string current_round() const { return at(job_names::kCurrent); }
  std::string ended() const { return at(job_names::kEnded); }
  std::string exited() const { return at(job_names::kExited); }
  std::string left(std::string_view agent) const { return at(job_names::kLeft, agent); }
  std::string left_all() const { return at(job_names::kLeft); }
  std::string done() const { return at(job_names::kDone); }
  // The `n`th time (from 1) a node of `host` left this run of the job unfit for it.
  std::string unfit(std::string_view host, int n) const {
    return at(job_names::kUnfit, std::string(host) + "/" + std::to_string(n));
  }

 private:
  std::string run_id_;
  int64_t generation_;
};

// The quorum of a fault-tolerant job's replica groups (launcher/ft/coordinator.hpp), under the job's
// own namespace (each group's world runs as the job "<run_id>.rg<ID>"):
//   /ddprun/<run_id>/ft/groups           the replica groups that ever asked (APPEND: "2,0,1,")
//   /ddprun/<run_id>/ft/beat/<group>     a group's heartbeat: "<incarnation> <counter>", or "gone"
//   /ddprun/<run_id>/ft/ask/<seq>/<g>    group g's request for quorum <seq> (a Member, as JSON)
//   /ddprun/<run_id>/ft/q/<seq>          quorum <seq> as decided (the first proposal wins)
//   /ddprun/<run_id>/ft/latest           the latest quorum's seq (a hint: q/<latest + 1> may exist)
class QuorumKeys : public KeysUnder {
 public:
  explicit QuorumKeys(std::string_view run_id, std::string_view root = core::kRoot)
      : KeysUnder(core::job_prefix(run_id, root) + "ft/") {}
  std::string groups() const { return at("groups"); }
  std::string beat(int group) const { return at("beat/", std::to_string(group)); }
  std::string ask(int64_t seq, int group) const {
    return at("ask/", std::to_string(seq) + "/" + std::to_string(group));
  }
  std::string quorum(int64_t seq) const { return at("q/", std::to_string(seq)); }
  std::string latest() const { return at("latest"); }
  // The job's end, recorded by the first group whose workers all finished.
  std::string finished() const { return at("finished"); }
};

// A group's heartbeat value once its workers are gone (else "<incarnation> <count>").
inline constexpr std::string_view kGoneBeat = "gone";
// The groups in the value of QuorumKeys::groups() ("0,2,1,": each group appends itself once),
// sorted, each once; what is not a number is passed over.
std::vector<int> parse_group_registry(std::string_view value);

// The run id of replica group `group`'s own world in job `run_id`.
inline std::string replica_group_run_id(std::string_view run_id, int group) {
  return std::string(run_id) + ".rg" + std::to_string(group);
}

// The names of an agent's heartbeat keys within a generation (ParsedKey::name): "hb/<agent>" and
// "hb/<agent>/time".
std::string heartbeat_name(std::string_view agent);
std::string heartbeat_time_name(std::string_view agent);

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
  std::string detail;      // human-readable
  int node = -1;           // NodeLost: the lost node; Failure/Hang: the node that reported it
  nlohmann::json failure;  // Failure, Hang: a JSON object
};

// The value written to an `end` key.
std::string encode_outcome(const Outcome& outcome);
// Never throws: text that is not an outcome reads as a Failure whose detail is the text.
Outcome decode_outcome(std::string_view text);
// "succeeded", "failed", "stopped", "node_lost", "re-rendezvous", "hung".
std::string_view state_name(Outcome::Kind kind);

}  // namespace ddprun::rdzv::jobs
