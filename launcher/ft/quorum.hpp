#pragma once
// The quorum of a fault-tolerant job's replica groups, as pure functions: which groups train the
// next step together, and what each of them must do (heal from whom, lead the cross-group process
// group or not). No I/O and no clock: the coordinator (coordinator.hpp) gathers what the groups
// asked and which of them heartbeat, and calls decide(); a group's relay turns the quorum into
// its workers' view with view_of().
//
// Rules (torchft's lighthouse, and two more):
//   - a group takes part when it asked for this quorum and heartbeats;
//   - at least `min_groups` must take part;
//   - fast quorum: when every member of the previous quorum asked, decide at once;
//   - otherwise more than half of the heartbeating groups must take part (two halves of a
//     partition never both train), and the quorum waits for heartbeating groups that have not
//     asked yet up to `join_timeout`, then goes on without them: for every such group before the
//     job's first quorum, after it only for members of the previous quorum that heartbeat as the
//     same incarnation (they are in their step); a group back from a restart, or new, takes part
//     from the quorum it asks in, and nobody waits for its start;
//   - shrink-only (asked by any participant): only members of the previous quorum take part;
//   - a group that reports a step beyond what the job can have committed (more than one past the
//     previous quorum's highest step) is left out, with the reason;
//   - no quorum forms unless one of its groups holds the previous quorum's highest step and one is
//     either a member of that quorum back as it was (the same incarnation) or past that step: the
//     step was committed (and the one after it may have been), and groups that start again from
//     behind would commit steps a second time, under another membership; the quorum waits;
//   - the quorum id changes whenever the membership does (a group back as a new incarnation is a
//     new member), so the cross-group process group is rebuilt exactly when it must be.

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun::launcher::ft {

// The highest step a record may carry: what every JSON reader (Python's, a browser's) holds
// exactly, and far from int64's end, so that "one past the highest step" never overflows.
constexpr int64_t kMostSteps = (int64_t{1} << 53) - 1;
// `record`'s "step": a whole number from 0 to kMostSteps. Throws ProtocolError saying what it is
// instead (a worker's ask, another group's record: whatever a peer sent).
int64_t step_of(const nlohmann::json& record);

// One replica group's request for the next quorum.
struct Member {
  int group = 0;            // --replica_group
  std::string incarnation;  // changes whenever the group's workers start again
  int64_t step = 0;         // the steps the group has committed
  int world_size = 1;       // ranks in the group
  std::string store;        // host:port of the group's worker store
  // Where each of the group's ranks serves its state to a healing peer (host:port), by group rank;
  // empty when it serves none.
  std::vector<std::string> recovery;
  std::vector<std::string> addresses;  // the group's node addresses (its workers connect from there)
  bool shrink_only = false;
  bool pg_ok = true;  // the group's last step committed (its cross-group collectives worked)

  // "<group>/<incarnation>": who a member is, for the quorum id.
  std::string id() const { return std::to_string(group) + "/" + incarnation; }
};
void to_json(nlohmann::json& j, const Member& m);
void from_json(const nlohmann::json& j, Member& m);

struct Quorum {
  int64_t seq = 0;              // every quorum issued, from 1
  int64_t id = 0;               // changes with the membership, from 1
  std::vector<Member> members;  // by group
  // Why a group was left out, each "group <N> ...": one that asked, or a member of the previous
  // quorum that is not back.
  std::vector<std::string> left_out;

  int64_t max_step() const;
  const Member* member(int group) const;
  // The reason `left_out` gives for `group`, if any.
  std::optional<std::string> why_left_out(int group) const;
};
void to_json(nlohmann::json& j, const Quorum& q);
void from_json(const nlohmann::json& j, Quorum& q);

struct Rules {
  int min_groups = 1;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(60)};
};

// What the deciding side sees.
struct Candidates {
  std::vector<Member> asking;           // groups that asked for this quorum (at most one record per group)
  std::set<int> healthy;                // groups whose heartbeat is fresh, asking or not
  std::chrono::milliseconds waited{0};  // since the first ask of this quorum was seen
  // The incarnation each healthy group heartbeats as (a group back from a restart is a new one).
  std::map<int, std::string> incarnations;
};

// A quorum to propose, or why not yet.
struct Decision {
  std::optional<Quorum> quorum;
  std::string waiting;  // what the quorum waits for, when it is not ready
};

// `previous`: the quorum before this one (nullopt for the job's first, or after the coordinator
// lost its history); `seq`: the sequence number of the quorum to decide.
Decision decide(const std::optional<Quorum>& previous, int64_t seq, const Candidates& candidates, const Rules& rules);

// What one group makes of a quorum.
struct GroupView {
  int64_t seq = 0;
  int64_t quorum_id = 0;
  int replica_rank = 0;        // this group's place among the members
  int replica_world_size = 0;  // members
  int64_t max_step = 0;        // the highest committed step among the members
  // Members at max_step: the groups whose gradients count this step (a healing group takes part in
  // the collectives with zeros and applies the average the others computed).
  int participants = 0;
  // This group's place among the participants (by replica rank), or -1 when it heals this step:
  // what a sampler that follows the committed steps splits the step's samples by.
  int participant_rank = -1;
  bool heal = false;                           // behind max_step: fetch the state from `recover_from`
  int recover_from = -1;                       // the group to heal from (one at max_step), or -1
  std::vector<std::string> recover_addresses;  // its ranks' recovery addresses
  // The groups that heal from this one (it must keep its state of max_step for them).
  std::vector<int> serves;
  std::string store;                   // the cross-group process group's store: a member at max_step
  std::vector<int> groups;             // the members, by replica rank
  std::vector<std::string> addresses;  // every member's node addresses
  // A member's last step failed: every member builds its cross-group process group afresh (as
  // they all do when quorum_id changes), since the old one may be broken.
  bool reconfigure = false;
};
void to_json(nlohmann::json& j, const GroupView& v);

// `group` must be a member of `quorum`.
GroupView view_of(const Quorum& quorum, int group);

}  // namespace ddprun::launcher::ft
