#include "launcher/ft/quorum.hpp"

#include <algorithm>
#include <map>

#include "common/errors.hpp"
#include "common/printable.hpp"

namespace ddprun::launcher::ft {

int64_t step_of(const nlohmann::json& record) {
  const auto it = record.find("step");
  if (it == record.end()) throw ProtocolError("it has no \"step\"");
  // An unsigned value above int64's range, a float (1e19), a string: each is said as it came.
  const bool whole = it->is_number_integer();
  const bool in_range =
      whole && (it->is_number_unsigned() ? it->get<uint64_t>() <= uint64_t(kMostSteps)
                                         : it->get<int64_t>() >= 0 && it->get<int64_t>() <= kMostSteps);
  if (!in_range)
    throw ProtocolError("its \"step\" is " + printable_start(it->dump(), 40) +
                        ", not a whole number of steps from 0 to " + std::to_string(kMostSteps));
  return it->get<int64_t>();
}

void to_json(nlohmann::json& j, const Member& m) {
  j = nlohmann::json{
      {"group", m.group}, {"incarnation", m.incarnation}, {"step", m.step},           {"world_size", m.world_size},
      {"store", m.store}, {"recovery", m.recovery},       {"addresses", m.addresses}, {"shrink_only", m.shrink_only},
      {"pg_ok", m.pg_ok}};
}

void from_json(const nlohmann::json& j, Member& m) {
  m.group = j.at("group").get<int>();
  m.incarnation = j.at("incarnation").get<std::string>();
  m.step = step_of(j);
  m.world_size = j.value("world_size", 1);
  m.store = j.value("store", std::string());
  m.recovery = j.value("recovery", std::vector<std::string>{});
  m.addresses = j.value("addresses", std::vector<std::string>{});
  m.shrink_only = j.value("shrink_only", false);
  m.pg_ok = j.value("pg_ok", true);
}

int64_t Quorum::max_step() const {
  if (members.empty()) return 0;
  int64_t best = members.front().step;
  for (const Member& m : members) best = std::max(best, m.step);
  return best;
}

const Member* Quorum::member(int group) const {
  for (const Member& m : members)
    if (m.group == group) return &m;
  return nullptr;
}

std::optional<std::string> Quorum::why_left_out(int group) const {
  const std::string prefix = "group " + std::to_string(group) + " ";
  for (const std::string& reason : left_out)
    if (reason.rfind(prefix, 0) == 0) return reason;
  return std::nullopt;
}

void to_json(nlohmann::json& j, const Quorum& q) {
  j = nlohmann::json{{"seq", q.seq}, {"id", q.id}, {"members", q.members}, {"left_out", q.left_out}};
}

void from_json(const nlohmann::json& j, Quorum& q) {
  q.seq = j.at("seq").get<int64_t>();
  q.id = j.at("id").get<int64_t>();
  q.members = j.at("members").get<std::vector<Member>>();
  q.left_out = j.value("left_out", std::vector<std::string>{});
}

namespace {

std::string list_groups(const std::set<int>& groups) {
  std::string out;
  for (int g : groups) {
    if (!out.empty()) out += ", ";
    out += std::to_string(g);
  }
  return out;
}

std::set<std::string> ids_of(const std::vector<Member>& members) {
  std::set<std::string> ids;
  for (const Member& m : members) ids.insert(m.id());
  return ids;
}

}  // namespace

Decision decide(const std::optional<Quorum>& previous, int64_t seq, const Candidates& candidates, const Rules& rules) {
  Decision d;
  std::vector<std::string> left_out;
  // The participants: asked and heartbeating, one record per group, by group.
  std::map<int, Member> participants;
  std::set<int> refused;  // asked and were left out: nobody waits for them
  for (const Member& m : candidates.asking) {
    if (!candidates.healthy.count(m.group)) continue;  // asked, then went quiet
    if (previous && m.step > previous->max_step() + 1) {
      // Every commit takes a quorum, and a quorum lets its members commit one step: no group can
      // be further ahead than that.
      left_out.push_back("group " + std::to_string(m.group) + " reports step " + std::to_string(m.step) +
                         ", but the job can have committed at most step " + std::to_string(previous->max_step() + 1) +
                         ": left out");
      refused.insert(m.group);
      continue;
    }
    participants[m.group] = m;
  }
  const bool shrink_only = previous && std::any_of(participants.begin(), participants.end(),
                                                   [](const auto& p) { return p.second.shrink_only; });
  if (shrink_only) {
    for (auto it = participants.begin(); it != participants.end();) {
      if (previous->member(it->first) == nullptr) {
        left_out.push_back("group " + std::to_string(it->first) + " is not a member of quorum " +
                           std::to_string(previous->seq) + " and the quorum only shrinks: left out");
        refused.insert(it->first);
        it = participants.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::set<int> asked;
  for (const auto& [g, m] : participants) asked.insert(g);
  // Whether `g`, heartbeating, is the previous quorum's member `g` in its step (the same
  // incarnation), rather than a group back from a restart or new to the job.
  const auto in_its_step = [&](int g) {
    const Member* was = previous ? previous->member(g) : nullptr;
    const auto beat = candidates.incarnations.find(g);
    return was != nullptr && beat != candidates.incarnations.end() && beat->second == was->incarnation;
  };
  const auto ready = [&] {
    Quorum q;
    q.seq = seq;
    for (auto& [g, m] : participants) q.members.push_back(m);
    q.left_out = left_out;
    // The previous members that are not back, and why, as the deciding agent saw it (the others'
    // view of a heartbeat may differ by a beat).
    if (previous) {
      for (const Member& m : previous->members) {
        if (participants.count(m.group) || refused.count(m.group)) continue;
        q.left_out.push_back("group " + std::to_string(m.group) +
                             (!candidates.healthy.count(m.group)
                                  ? " sent no heartbeat within quorum_heartbeat_timeout (its workers failed, or it "
                                    "cannot reach the quorum)"
                              : in_its_step(m.group) ? " had not asked by the join timeout"
                                                     : " is back from a restart and had not asked yet: it takes part "
                                                       "from the quorum it asks in"));
      }
    }
    q.id = previous ? (ids_of(q.members) == ids_of(previous->members) ? previous->id : previous->id + 1) : 1;
    d.quorum = std::move(q);
    return d;
  };
  if (static_cast<int>(participants.size()) < rules.min_groups) {
    d.waiting = std::to_string(participants.size()) + " of the " + std::to_string(rules.min_groups) +
                " replica groups needed have asked (asked: " + (asked.empty() ? "none" : list_groups(asked)) + ")";
    // The groups it waits for: the job's others this side knows of (the last quorum's members, and
    // any that heartbeat), each with what it is doing.
    std::set<int> known(candidates.healthy.begin(), candidates.healthy.end());
    if (previous) {
      for (const Member& m : previous->members) known.insert(m.group);
    }
    std::string awaited;
    for (int g : known) {
      if (asked.count(g) || refused.count(g)) continue;
      awaited += std::string(awaited.empty() ? "" : ", ") + "group " + std::to_string(g) +
                 (candidates.healthy.count(g) ? " (heartbeats, has not asked yet)"
                                              : " (no heartbeat: its workers failed, or it cannot reach the quorum)");
    }
    d.waiting += awaited.empty() ? "; no other group of the job heartbeats yet" : "; waiting for " + awaited;
    return d;
  }
  if (previous && !previous->members.empty() && !participants.empty()) {
    // The last quorum's members may have committed one step past its highest: unless one of them
    // is back as it was (the same incarnation) or a group holds that step, nobody can tell.
    int64_t best = 0;
    bool member_back = false;
    for (const auto& [g, m] : participants) {
      best = std::max(best, m.step);
      const Member* was = previous->member(g);
      member_back = member_back || (was != nullptr && was->id() == m.id());
    }
    if (best < previous->max_step() || (!member_back && best <= previous->max_step())) {
      d.waiting = best < previous->max_step()
                      ? "no group that asked holds step " + std::to_string(previous->max_step()) + ", which quorum " +
                            std::to_string(previous->seq) + " had (asked: " + list_groups(asked) +
                            ", at most at step " + std::to_string(best) + ")"
                      : "none of the groups that asked (" + list_groups(asked) + ") is a member of quorum " +
                            std::to_string(previous->seq) + " back as it was, or holds step " +
                            std::to_string(previous->max_step() + 1) + ", which its members may have committed";
      d.waiting +=
          "; waiting for a group that holds the job's state, since training from behind it would commit "
          "steps twice";
      return d;
    }
  }
  if (previous && !previous->members.empty()) {
    bool all_back = true;
    for (const Member& m : previous->members)
      if (!participants.count(m.group) || participants.at(m.group).id() != m.id()) all_back = false;
    if (all_back) return ready();  // fast quorum
  }
  std::set<int> heartbeating = candidates.healthy;
  heartbeating.insert(asked.begin(), asked.end());
  if (participants.size() * 2 <= heartbeating.size()) {
    d.waiting = "only " + std::to_string(participants.size()) + " of " + std::to_string(heartbeating.size()) +
                " heartbeating replica groups have asked (" + list_groups(asked) +
                "); a quorum needs more than half of them";
    return d;
  }
  std::set<int> missing;
  std::set_difference(heartbeating.begin(), heartbeating.end(), asked.begin(), asked.end(),
                      std::inserter(missing, missing.end()));
  for (int g : refused) missing.erase(g);
  if (previous) {
    // A group that restarted (or joined) heartbeats before its workers ask; waiting for it would
    // hold the others for its whole start, up to the join timeout. It takes part once it asks.
    for (auto it = missing.begin(); it != missing.end();) it = in_its_step(*it) ? std::next(it) : missing.erase(it);
  }
  if (shrink_only) {
    // Groups outside the previous quorum may not join: nobody waits for them.
    for (auto it = missing.begin(); it != missing.end();)
      it = previous->member(*it) ? std::next(it) : missing.erase(it);
  }
  if (missing.empty() || candidates.waited >= rules.join_timeout) return ready();
  d.waiting =
      "waiting for replica group(s) " + list_groups(missing) + " (heartbeating, not asked yet) up to the join timeout";
  return d;
}

void to_json(nlohmann::json& j, const GroupView& v) {
  j = nlohmann::json{{"seq", v.seq},
                     {"quorum_id", v.quorum_id},
                     {"replica_rank", v.replica_rank},
                     {"replica_world_size", v.replica_world_size},
                     {"max_step", v.max_step},
                     {"participants", v.participants},
                     {"participant_rank", v.participant_rank},
                     {"heal", v.heal},
                     {"recover_from", v.recover_from},
                     {"recover_addresses", v.recover_addresses},
                     {"serves", v.serves},
                     {"store", v.store},
                     {"groups", v.groups},
                     {"reconfigure", v.reconfigure}};
}

GroupView view_of(const Quorum& quorum, int group) {
  GroupView v;
  v.seq = quorum.seq;
  v.quorum_id = quorum.id;
  v.replica_world_size = static_cast<int>(quorum.members.size());
  v.max_step = quorum.max_step();
  std::vector<const Member*> up_to_date;
  std::vector<const Member*> behind;
  // Before the first commit every member but the first takes the first's state, as DDP broadcasts
  // rank 0's parameters: groups that started from different initial states never train apart.
  const bool init_sync = v.max_step == 0;
  for (size_t i = 0; i < quorum.members.size(); ++i) {
    const Member& m = quorum.members[i];
    if (m.group == group) v.replica_rank = static_cast<int>(i);
    v.groups.push_back(m.group);
    v.addresses.insert(v.addresses.end(), m.addresses.begin(), m.addresses.end());
    if (!m.pg_ok) v.reconfigure = true;
    const bool current = m.step == v.max_step && !(init_sync && !up_to_date.empty());
    if (current && m.group == group) v.participant_rank = static_cast<int>(up_to_date.size());
    (current ? up_to_date : behind).push_back(&m);
  }
  v.participants = static_cast<int>(up_to_date.size());
  if (up_to_date.empty()) throw ProtocolError("quorum " + std::to_string(quorum.seq) + " has no members");
  // The cross-group store: the first member at max_step (never a group that is about to heal).
  v.store = up_to_date.front()->store;
  // Groups behind heal from the up-to-date ones in turn, so that no one group serves them all.
  for (size_t i = 0; i < behind.size(); ++i) {
    const Member* source = up_to_date[i % up_to_date.size()];
    if (behind[i]->group == group) {
      v.heal = true;
      v.recover_from = source->group;
      v.recover_addresses = source->recovery;
    }
    if (source->group == group) v.serves.push_back(behind[i]->group);
  }
  return v;
}

}  // namespace ddprun::launcher::ft
