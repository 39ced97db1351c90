#include "launcher/ft/coordinator.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/numbers.hpp"
#include "common/system.hpp"
#include "rendezvous/client/client.hpp"

namespace ddprun::launcher::ft {

using nlohmann::json;

std::string Finished::describe() const {
  return "the job finished at step " + std::to_string(step) + " (replica group " + std::to_string(group) +
         (at.empty() ? "" : ", " + at) + ")";
}

void to_json(json& j, const Finished& f) { j = json{{"step", f.step}, {"group", f.group}, {"at", f.at}}; }

void from_json(const json& j, Finished& f) {
  f.step = step_of(j);
  f.group = j.at("group").get<int>();
  f.at = j.value("at", std::string());
}

// ---- StoreQuorumKv -------------------------------------------------------------------------------

StoreQuorumKv::StoreQuorumKv(std::unique_ptr<rdzv::client::Client> client) : client_(std::move(client)) {}
StoreQuorumKv::~StoreQuorumKv() = default;

void StoreQuorumKv::put(const std::string& key, const std::string& value) { client_->set(key, value); }

std::vector<std::optional<std::string>> StoreQuorumKv::read(const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> out;
  if (keys.empty()) return out;
  // A missing key reads as empty; no value of the protocol is empty.
  for (std::string& v : client_->multi_get_now(keys)) {
    out.push_back(v.empty() ? std::nullopt : std::optional<std::string>(std::move(v)));
  }
  return out;
}

std::string StoreQuorumKv::create_or_get(const std::string& key, const std::string& value) {
  return client_->compare_set(key, "", value);
}

bool StoreQuorumKv::wait_for(const std::string& key, std::chrono::milliseconds slice) {
  return client_->wait_for({key}, slice);
}

void StoreQuorumKv::erase(const std::string& key) { client_->delete_key(key); }

void StoreQuorumKv::register_group(const std::string& registry, int group) {
  const auto known = groups(registry);
  if (std::find(known.begin(), known.end(), group) == known.end())
    client_->append(registry, std::to_string(group) + ",");
}

std::vector<int> StoreQuorumKv::groups(const std::string& registry) {
  const auto value = read({registry}).front();
  return value ? rdzv::jobs::parse_group_registry(*value) : std::vector<int>{};
}

// ---- Coordinator ---------------------------------------------------------------------------------

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<QuorumKv> kv, std::unique_ptr<QuorumKv> beat_kv)
    : options_(std::move(options)),
      keys_(options_.run_id, options_.root),
      kv_(std::move(kv)),
      beat_kv_(std::move(beat_kv)) {
  kv_->register_group(keys_.groups(), options_.group);
  beat_thread_ = std::thread([this] { heartbeat_loop(); });
}

Coordinator::~Coordinator() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (beat_thread_.joinable()) beat_thread_.join();
}

void Coordinator::set_incarnation(const std::string& incarnation) {
  std::lock_guard lock(mutex_);
  incarnation_ = incarnation;
  withdrawn_ = false;
  gone_said_ = false;
}

void Coordinator::withdraw() {
  // Said by the heartbeat thread, on its connection after its last beat: a beat still in flight
  // can never land after the "gone" and make the group look alive until the timeout. Never blocks
  // the caller (the supervisor's thread, when a worker has just died).
  {
    std::lock_guard lock(mutex_);
    withdrawn_ = true;
    gone_said_ = false;
  }
  cv_.notify_all();
}

void Coordinator::heartbeat_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    const std::string incarnation = incarnation_;
    const bool say_gone = withdrawn_ && !gone_said_;
    const bool beat = !incarnation.empty() && !withdrawn_ && !stopping_;
    const uint64_t n = ++beats_;
    if (stopping_ && !say_gone) break;
    lock.unlock();
    bool said = false;
    try {
      if (say_gone) {
        beat_kv_->put(keys_.beat(options_.group), std::string(rdzv::jobs::kGoneBeat));
        said = true;
      } else if (beat) {
        beat_kv_->put(keys_.beat(options_.group), incarnation + " " + std::to_string(n));
      }
      const std::vector<int> groups = beat_kv_->groups(keys_.groups());
      std::vector<std::string> keys;
      for (int g : groups) keys.push_back(keys_.beat(g));
      observe(groups, beat_kv_->read(keys));
    } catch (const Error& e) {
      // The store is away (a daemon restarting): the others see no beat either; try again.
      log::debug("ddprun") << "replica group " << options_.group << ": heartbeat: " << e.what();
    }
    lock.lock();
    if (said && withdrawn_) gone_said_ = true;
    if (stopping_ && said) break;
    if (stopping_ && say_gone) {
      // Stopping, and the store did not take the "gone": one try only (retrying would hold ddprun's
      // exit for as long as the store is away); the others count this group out after its heartbeat
      // timeout.
      log::warn("ddprun") << "replica group " << options_.group
                          << ": could not tell the quorum that this group left (its store is away): the other "
                             "groups count it out once its heartbeat is "
                          << seconds_text(options_.heartbeat_timeout) << " old";
      break;
    }
    // A "gone" the store did not take is tried again at the next beat, not at once (a store that
    // refuses at once would make this a busy loop).
    const bool retry_later = say_gone && !said;
    cv_.wait_for(lock, options_.heartbeat_interval,
                 [this, retry_later] { return stopping_ || (!retry_later && withdrawn_ && !gone_said_); });
  }
}

void Coordinator::observe(const std::vector<int>& groups, const std::vector<std::optional<std::string>>& beats) {
  const auto now = Clock::now();
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < groups.size() && i < beats.size(); ++i) {
    const std::string value = beats[i].value_or(std::string(rdzv::jobs::kGoneBeat));
    auto it = seen_.find(groups[i]);
    if (it == seen_.end()) {
      // First sight: a group that heartbeats counts as fresh from now.
      seen_[groups[i]] = {value, now};
    } else if (it->second.value != value) {
      it->second = {value, now};
    }
  }
}

std::set<int> Coordinator::healthy() const {
  const auto now = Clock::now();
  std::lock_guard lock(mutex_);
  std::set<int> out;
  for (const auto& [g, seen] : seen_) {
    if (seen.value != rdzv::jobs::kGoneBeat && now - seen.changed < options_.heartbeat_timeout) out.insert(g);
  }
  return out;
}

int64_t Coordinator::latest_seq() {
  int64_t seq = 0;
  if (const auto v = kv_->read({keys_.latest()}).front()) seq = to_int(*v).value_or(0);
  // The hint may lag (its writes race): walk forward to the last quorum decided.
  while (kv_->read({keys_.quorum(seq + 1)}).front()) ++seq;
  return seq;
}

std::optional<Quorum> Coordinator::read_quorum(int64_t seq) {
  if (seq <= 0) return std::nullopt;
  if (previous_cache_ && previous_cache_->seq == seq) return previous_cache_;
  const auto v = kv_->read({keys_.quorum(seq)}).front();
  if (!v) return std::nullopt;
  try {
    Quorum q = json::parse(*v).get<Quorum>();
    previous_cache_ = q;
    return q;
  } catch (const std::exception& e) {  // json's errors, and a step that is no step (ProtocolError)
    log::warn("ddprun") << "quorum " << seq << " of job '" << options_.run_id << "' cannot be read (" << e.what()
                        << "): deciding the next one without it";
    return std::nullopt;
  }
}

std::string Coordinator::try_decide(int64_t seq, Clock::duration waited) {
  const std::vector<int> groups = kv_->groups(keys_.groups());
  // The asks and the heartbeats in one read: a group's heartbeat as fresh as its ask (a group back
  // as a new incarnation beats before it asks, so it is never taken for the one that left).
  std::vector<std::string> keys;
  for (int g : groups) keys.push_back(keys_.ask(seq, g));
  for (int g : groups) keys.push_back(keys_.beat(g));
  keys.push_back(keys_.finished());  // the job's end, if a group recorded it
  keys.push_back(keys_.latest());    // and the latest quorum's seq, for next()'s wait
  auto read = kv_->read(keys);
  hinted_latest_ = read.back() ? to_int(*read.back()).value_or(0) : 0;
  read.pop_back();
  if (read.back()) {
    try {
      Finished f = json::parse(*read.back()).get<Finished>();
      std::lock_guard lock(mutex_);
      finished_ = std::move(f);
    } catch (const std::exception& e) {  // json's errors, and a step that is no step (ProtocolError)
      log::warn("ddprun") << "the job's end record cannot be read (" << e.what() << "): ignored";
    }
  }
  read.pop_back();
  const std::vector<std::optional<std::string>> beats(read.begin() + static_cast<std::ptrdiff_t>(groups.size()),
                                                      read.end());
  read.resize(groups.size());
  observe(groups, beats);
  Candidates c;
  const auto& asks = read;
  for (size_t i = 0; i < asks.size(); ++i) {
    if (!asks[i]) continue;
    try {
      Member m = json::parse(*asks[i]).get<Member>();
      if (m.group != groups[i]) continue;  // a record under another group's key: not a request
      c.asking.push_back(std::move(m));
    } catch (const std::exception& e) {  // json's errors, and a step that is no step (ProtocolError)
      log::warn("ddprun") << "quorum " << seq << ": replica group " << groups[i] << "'s request cannot be read ("
                          << e.what() << "): ignored";
    }
  }
  c.healthy = healthy();
  {
    // "<incarnation> <beat>": what each healthy group heartbeats as.
    std::lock_guard lock(mutex_);
    for (int g : c.healthy) {
      const std::string& beat = seen_.at(g).value;
      c.incarnations[g] = beat.substr(0, beat.rfind(' '));
    }
  }
  // The job's recorded end, with every heartbeating group asking from behind it: nobody holds its
  // state any more (the groups that did finished and left), so nothing is left to train; the
  // quorum would otherwise wait until the timeout, since none holds the last quorum's step.
  if (const auto done = job_over(c)) {
    std::lock_guard lock(mutex_);
    over_ = done;
    throw JobFinished(*done);
  }
  c.waited = std::chrono::duration_cast<std::chrono::milliseconds>(waited);
  const std::optional<Quorum> previous = read_quorum(seq - 1);
  Decision d = decide(previous, seq, c, options_.rules);
  if (!d.quorum) return d.waiting;
  const std::string mine = json(*d.quorum).dump();
  if (kv_->create_or_get(keys_.quorum(seq), mine) == mine) {
    // Groups of the previous quorum are in every agent's membership line (say_membership); the
    // others left out (newcomers refused) are said here, once.
    std::set<std::string> said_there;
    if (previous)
      for (const Member& m : previous->members)
        if (auto why = d.quorum->why_left_out(m.group)) said_there.insert(std::move(*why));
    for (const std::string& why : d.quorum->left_out)
      if (!said_there.count(why)) log::warn("ddprun") << "quorum " << seq << ": " << why;
    collect_garbage(seq);
  }
  return {};
}

void Coordinator::collect_garbage(int64_t seq) {
  const int64_t old = seq - options_.keep;
  if (old <= 0) return;
  try {
    for (int g : kv_->groups(keys_.groups())) kv_->erase(keys_.ask(old, g));
    kv_->erase(keys_.quorum(old));
  } catch (const Error& e) {
    log::debug("ddprun") << "quorum " << old << ": not erased: " << e.what();
  }
}

void Coordinator::say_membership(const Quorum& q) {
  std::set<int> now;
  for (const Member& m : q.members) now.insert(m.group);
  const GroupView mine = view_of(q, options_.group);
  const bool missed = last_seq_ > 0 && q.seq > last_seq_ + 1;
  // Groups of the last quorum that are back as a new incarnation (their workers restarted): the
  // same groups, other members (a survivor that waited for one says so when it is back).
  std::vector<const Member*> restarted;
  for (const Member& m : q.members) {
    const auto was = last_incarnations_.find(m.group);
    if (was != last_incarnations_.end() && was->second != m.incarnation) restarted.push_back(&m);
  }
  std::map<int, std::string> incarnations;
  for (const Member& m : q.members) incarnations[m.group] = m.incarnation;
  last_incarnations_ = std::move(incarnations);
  if (now == last_groups_ && !missed && !mine.heal && restarted.empty()) return;
  std::string line = "replica group " + std::to_string(options_.group) + ": quorum " + std::to_string(q.seq) + " (id " +
                     std::to_string(q.id) + ", step " + std::to_string(q.max_step()) + ") trains with group(s) ";
  bool first = true;
  for (int g : now) line += (first ? "" : ", ") + std::to_string(g), first = false;
  bool lost = false;
  for (int g : last_groups_) {
    if (now.count(g)) continue;
    lost = true;
    line += "; without group " + std::to_string(g) + ": " +
            q.why_left_out(g).value_or("group " + std::to_string(g) + " was not in the quorums between");
  }
  if (!last_groups_.empty()) {
    for (const Member& m : q.members) {
      if (last_groups_.count(m.group)) continue;
      const GroupView v = view_of(q, m.group);
      line += "; with group " + std::to_string(m.group) + " (at step " + std::to_string(m.step) +
              (v.heal ? ": heals from group " + std::to_string(v.recover_from) + ")" : ")");
    }
  }
  for (const Member* m : restarted) {
    if (m->group == options_.group) continue;  // this group's own restart: its heal says it
    const GroupView v = view_of(q, m->group);
    line += "; group " + std::to_string(m->group) + " is back from a restart (at step " + std::to_string(m->step) +
            (v.heal ? ": heals from group " + std::to_string(v.recover_from) + ")" : ")");
  }
  if (missed)
    line += "; this group was out of quorum(s) " + std::to_string(last_seq_ + 1) + ".." + std::to_string(q.seq - 1);
  if (mine.heal)
    line += "; this group is at step " + std::to_string(q.member(options_.group)->step) + " and heals from group " +
            std::to_string(mine.recover_from);
  (lost ? log::warn("ddprun") : log::info("ddprun")) << line;
  last_groups_ = std::move(now);
}

std::optional<Finished> Coordinator::job_over(const Candidates& c) const {
  std::lock_guard lock(mutex_);
  if (!finished_) return std::nullopt;
  std::set<int> asking;
  bool mine = false;
  for (const Member& m : c.asking) {
    if (!c.healthy.count(m.group)) continue;             // asked, then went quiet
    if (m.step >= finished_->step) return std::nullopt;  // a group at the end asks: it trains on
    asking.insert(m.group);
    mine = mine || m.group == options_.group;
  }
  if (!mine) return std::nullopt;
  for (int g : c.healthy)
    if (!asking.count(g)) return std::nullopt;  // a group that may hold the state has not asked yet
  return finished_;
}

Finished Coordinator::finish(int64_t step) {
  Finished mine;
  mine.step = step;
  mine.group = options_.group;
  mine.at = utc_timestamp(std::chrono::system_clock::now());
  const std::string held = kv_->create_or_get(keys_.finished(), json(mine).dump());
  Finished record = mine;
  try {
    record = json::parse(held).get<Finished>();
  } catch (const std::exception&) {  // json's errors, and a step that is no step (ProtocolError)
    log::warn("ddprun") << "the job's end record cannot be read: " << held;
  }
  std::lock_guard lock(mutex_);
  finished_ = record;
  return record;
}

std::optional<Finished> Coordinator::over() const {
  std::lock_guard lock(mutex_);
  return over_;
}

Quorum Coordinator::next(Member self, const StopSignal& stop, std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(mutex_);
    self.incarnation = incarnation_;
  }
  self.group = options_.group;
  std::string beat;
  {
    std::lock_guard lock(mutex_);
    if (!withdrawn_ && !self.incarnation.empty()) beat = self.incarnation + " " + std::to_string(++beats_);
  }
  if (!beat.empty()) kv_->put(keys_.beat(self.group), beat);
  const auto start = Clock::now();
  auto said = start;
  // The quorum after the latest decided, which is after this group's last unless the others went on
  // without it (the quorums it missed may be erased by now).
  int64_t seq = std::max(last_seq_ + 1, latest_seq() + 1);
  for (;;) {
    kv_->put(keys_.ask(seq, self.group), json(self).dump());
    const auto asked = Clock::now();
    std::string waiting;
    for (;;) {
      if (stop.requested()) throw StopRequested(stop.signo());
      waiting = try_decide(seq, Clock::now() - asked);
      if (waiting.empty() || kv_->wait_for(keys_.quorum(seq), options_.poll)) break;
      // Decided and erased while this group looked away (a slow connection, a stopped process): the
      // latest quorum, as try_decide read it, is this one or later.
      if (hinted_latest_ >= seq) break;
      const auto now = Clock::now();
      if (now - start >= timeout) {
        // The ask goes with this group: left behind, it would count this group into a quorum the
        // others form later, one whose workers never come to its step. A quorum a peer decided from
        // the ask before it went is still this group's: taken below like any other.
        bool decided = false;
        try {
          kv_->erase(keys_.ask(seq, self.group));
          decided = kv_->read({keys_.quorum(seq)}).front().has_value();
        } catch (const std::exception& e) {
          log::debug("ddprun") << "quorum " << seq << ": ask of group " << self.group << " not erased: " << e.what();
        }
        if (decided) break;
        throw TimeoutError("replica group " + std::to_string(self.group) + " got no quorum " + std::to_string(seq) +
                           " of job '" + options_.run_id + "' in " +
                           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
                           " s: " + waiting);
      }
      if (now - said >= options_.progress_interval) {
        log::info("ddprun") << "replica group " << self.group << ": quorum " << seq << ": " << waiting;
        said = now;
      }
    }
    const auto q = read_quorum(seq);
    if (!q) {
      // Decided and already erased: the others are several quorums further on.
      seq = std::max(seq + 1, latest_seq() + 1);
      continue;
    }
    if (const auto v = kv_->read({keys_.latest()}).front(); !v || to_int(*v).value_or(0) < seq)
      kv_->put(keys_.latest(), std::to_string(seq));
    const Member* me = q->member(self.group);
    if (me && me->incarnation == self.incarnation) {
      say_membership(*q);
      last_seq_ = seq;
      return *q;
    }
    const std::string why = q->why_left_out(self.group).value_or("it asked too late");
    // A step no quorum can have given: this group's state is not the job's, and no later quorum
    // takes it either. Its workers are told (they fail, and come back to heal from a peer).
    if (self.step > q->max_step() + 1)
      throw Error("quorum " + std::to_string(seq) + " refused replica group " + std::to_string(self.group) + " (" +
                  why + "): its workers' step is not the job's, and no quorum takes it");
    log::info("ddprun") << "replica group " << self.group << ": quorum " << seq << " formed without it (" << why
                        << "); asking for the next one";
    seq = std::max(seq + 1, latest_seq() + 1);
  }
}

}  // namespace ddprun::launcher::ft
