#include "launcher/rendezvous/node_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/rendezvous/round_records.hpp"

namespace ddprun::launcher::rendezvous {

using ddprun::StopSignal;
using workers::WorkerExit;

using Clock = std::chrono::steady_clock;

namespace {

// How long one wait of the agent's thread lasts before it looks at a stop request again.
constexpr std::chrono::milliseconds kSlice{250};
// A join's waits: every slice that ends without an answer costs the store three requests (WAIT,
// CANCEL_WAIT, and a look at the round's end), and a join of thousands of nodes lasts seconds, so
// they start at half a second and double up to a second. A stop is still acted on within a second.
constexpr std::chrono::milliseconds kFirstJoinSlice{500};
constexpr std::chrono::milliseconds kMaxJoinSlice{1000};

// What a node that left without an end of its round records as the job's outcome.
constexpr const char* kLeftWithoutEnd = "signal:left";

// After a failure or a hang the world's nodes restart and rejoin; a spare gives them this long to
// take the next round's places first (their workers' state is warm, a node of theirs is fine).
constexpr std::chrono::milliseconds kSpareGrace{2000};
// How often a spare looks at the liveness of the world it waits behind.
constexpr std::chrono::milliseconds kSpareLook{1000};

}  // namespace

NodeRendezvous::~NodeRendezvous() { stop_watcher(); }

RoundEnd NodeRendezvous::decide(int round, const rdzv::jobs::Outcome& proposal) {
  // The first proposal wins; everyone reads the same decision back.
  return parse_round_end(create_or_get(round_keys(round).end(), rdzv::jobs::encode_outcome(proposal)));
}

RoundEnd NodeRendezvous::report_failure(int round, const WorkerExit& root_cause, const ProgressMark& progress) {
  return decide(round, failure_outcome(root_cause, node_rank(), progress));
}

RoundEnd NodeRendezvous::report_signal(int round, int signo) {
  // A node stopped in a job that may shrink (--nnodes MIN:MAX; docker stop, a pod evicted,
  // scale-down) leaves it: the others count it as lost and go on without it if MIN of them remain. Not the node that hosts the
  // store (nothing goes on without it), nor one still joining (it holds no place yet).
  const int node = node_rank();
  if (may_shrink() && node >= 0 && !hosts_the_store()) {
    rdzv::jobs::Outcome gone;
    gone.kind = rdzv::jobs::Outcome::Kind::NodeLost;
    gone.node = node;
    gone.detail =
        "node " + std::to_string(node) + " (" + settings_.host + ") left the job: stopped by " + signal_name(signo);
    departed_ = true;
    RoundEnd end = decide(round, gone);
    // Another end decided first (every node stopped, a failure): this node's leave is the ordinary one.
    if (end.kind != RoundEnd::Kind::NodeLost || end.root_node != node) departed_ = false;
    return end;
  }
  return decide(round, signal_outcome(signo, node, settings_.host));
}

void NodeRendezvous::ask_to_admit_this_node(int round, int running) {
  log::info("ddprun") << "job '" << settings_.run_id << "' is running with " << running
                      << " node(s): asking it to re-rendezvous to admit this node";
  rdzv::jobs::Outcome membership;
  membership.kind = rdzv::jobs::Outcome::Kind::Membership;
  membership.detail = "node " + settings_.host + " wants to join";
  decide(round, membership);
}

std::optional<RoundEnd> NodeRendezvous::job_ended() {
  const auto over = read(ended_key());
  if (!over) return std::nullopt;
  RoundEnd end = parse_round_end(*over);
  end.job_over = true;
  return end;
}

std::optional<RoundEnd> NodeRendezvous::wait_as_spare(int round, int running, const StopSignal& stop) {
  set_place(Place{});
  spare_ = true;
  const std::string why = "the job runs with all " + std::to_string(running) + " of --nnodes " +
                          std::to_string(settings_.min_nodes) + ":" + std::to_string(settings_.max_nodes);
  log::info("ddprun") << "job '" << settings_.run_id << "' (round " << round << "): " << why
                      << "; this node waits as a spare, to take the place of a node that is lost";
  spare_news(round, why, nullptr);
  const auto stopped = [&]() {
    stop_background();
    throw StopRequested(stop.signo());
  };
  // The world's liveness, looked at once a second (its membership may not be readable at once:
  // the node that closed the round writes it just after).
  std::unique_ptr<WorldLiveness> liveness;
  auto next_look = Clock::now();
  const auto lapsed = [&]() -> std::optional<std::vector<int>> {
    if (Clock::now() < next_look) return std::nullopt;
    next_look = Clock::now() + kSpareLook;
    if (!liveness) liveness = watch_liveness(round);
    if (!liveness) return std::nullopt;
    return liveness->lapsed();
  };
  RoundEnd end;
  try {
    const auto wait = wait_for_key(round_keys(round).end());
    for (;;) {
      if (auto e = wait->next(kSlice)) {
        end = parse_round_end(*e);
        break;
      }
      if (stop.requested()) stopped();
      if (const auto gone = lapsed(); gone && !gone->empty()) {
        const int g = gone->front();
        rdzv::jobs::Outcome lost;
        lost.kind = rdzv::jobs::Outcome::Kind::NodeLost;
        lost.node = g;
        lost.detail = "node " + std::to_string(g) + " (" + liveness->host(g) + ") " + liveness->lapse() +
                      " (its ddprun was killed or its host is unreachable); seen by a spare";
        end = decide(round, lost);
        break;
      }
    }
  } catch (const StopRequested&) {
    throw;
  } catch (const Error& e) {
    end = store_lost(e.what());
    end.job_over = true;
    return end;
  }
  spare_news(round, why, &end);
  if (end.kind == RoundEnd::Kind::Success) {
    end.job_over = true;
    return end;
  }
  // The world's nodes now go on to the next round (a restart, a re-formed world) or end the job.
  // The spare follows them: never into a round they did not come to (it would be a job of its own).
  // A lost node's place is taken as soon as a survivor is there; after a failure or a hang the
  // world's nodes, whose hosts are fine and whose workers' state is warm, get a moment to take the
  // next round's places first.
  const bool at_once = end.kind == RoundEnd::Kind::NodeLost || end.kind == RoundEnd::Kind::Membership;
  const auto deadline = Clock::now() + settings_.timeouts.join_timeout;
  std::optional<Clock::time_point> world_went_on;
  try {
    while (Clock::now() < deadline) {
      if (auto over = job_ended()) return over;
      // Every node of the job has left, and the generation's keys went with the last of them.
      if (!read(round_keys(round).end())) {
        end.job_over = true;
        return end;
      }
      const int64_t next = joined_nodes(round + 1);
      if (next >= settings_.max_nodes) return std::nullopt;  // full without this node: a spare there too
      if (next > 0 && !world_went_on) world_went_on = Clock::now();
      if (world_went_on && (at_once || Clock::now() - *world_went_on >= kSpareGrace)) return std::nullopt;
      // Every node of the world is gone: none of them goes on, this spare does in their place.
      if (const auto gone = lapsed(); gone && static_cast<int>(gone->size()) == liveness->nodes()) {
        log::info("ddprun") << "job '" << settings_.run_id << "': every node of round " << round << " is gone ("
                            << liveness->lapse() << "); this node goes on to the next round in their place";
        return std::nullopt;
      }
      if (stop.sleep_for(kSlice)) stopped();
    }
  } catch (const StopRequested&) {
    throw;
  } catch (const Error&) {
    // The store went with the job's last node (node 0 hosted it): the job is over.
    end.job_over = true;
    return end;
  }
  stop_background();
  throw TimeoutError("job '" + settings_.run_id + "': round " + std::to_string(round) + " ended (" + end.detail +
                     "), and in " + seconds_text(settings_.timeouts.join_timeout) +
                     " none of its nodes went on to the next round or ended the job (were they all killed?): "
                     "this spare leaves");
}

RoundEnd NodeRendezvous::store_lost(const std::string& why) const {
  RoundEnd lost;
  lost.kind = RoundEnd::Kind::StoreLost;
  lost.detail = "lost " + store_name() + ": " + why;
  return lost;
}

int NodeRendezvous::round_nodes() const {
  const int known = place().group_world_size;
  return known > 0 ? known : settings_.max_nodes;
}

void NodeRendezvous::watch(int round, std::function<void(const RoundEnd&)> on_end) {
  stop_watcher();
  std::shared_ptr<RoundWatch> w;
  try {
    w = watch_round(round);
  } catch (const std::exception& e) {
    on_end(store_lost(e.what()));
    return;
  }
  stop_watching_ = false;
  watcher_ = std::thread([this, round, w, on_end = std::move(on_end)] {
    try {
      for (;;) {
        if (stop_watching_) return;
        const RoundWatch::Event ev = w->next();
        if (ev.end) {
          on_end(parse_round_end(*ev.end));
          return;
        }
        if (ev.lost_node < 0) continue;
        rdzv::jobs::Outcome gone;
        gone.kind = rdzv::jobs::Outcome::Kind::NodeLost;
        gone.node = ev.lost_node;
        gone.detail = "node " + std::to_string(ev.lost_node) + " (" + host_of(ev.lost_node) + ") " + ev.lost_why +
                      " (its ddprun was killed or its host is unreachable)";
        on_end(parse_round_end(w->create_or_get(round_keys(round).end(), rdzv::jobs::encode_outcome(gone))));
        return;
      }
    } catch (const std::exception& e) {
      on_end(store_lost(e.what()));
    }
  });
}

RoundEnd NodeRendezvous::report_success(int round, const StopSignal& stop) {
  // Counted in before the count is read: whichever node finishes last sees every node finished.
  if (tally(round, Tally::Finished, true) >= round_nodes()) return decide(round, rdzv::jobs::Outcome{});
  return wait_end(round, stop);
}

std::optional<RoundEnd> NodeRendezvous::wait_end_for(int round, std::chrono::milliseconds timeout,
                                                     const StopSignal& stop) {
  try {
    const auto wait = wait_for_key(round_keys(round).end());
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline && !stop.requested()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (auto end = wait->next(std::clamp(left, std::chrono::milliseconds(1), kSlice))) return parse_round_end(*end);
    }
  } catch (const StopRequested&) {
    throw;
  } catch (const Error& e) {
    return store_lost(e.what());
  }
  return std::nullopt;
}

RoundEnd NodeRendezvous::wait_end(int round, const StopSignal& stop) {
  try {
    const auto wait = wait_for_key(round_keys(round).end());
    const auto start = Clock::now();
    auto next_report = start + settings_.progress_interval;
    for (;;) {
      if (auto end = wait->next(kSlice)) return parse_round_end(*end);
      // Stopped while the other nodes still run: decide the round (unless it just ended otherwise).
      if (stop.requested()) return report_signal(round, stop.signo());
      if (const auto now = Clock::now(); now >= next_report) {
        log::info("ddprun") << "waiting for the other nodes to finish: " << tally(round, Tally::Finished, false)
                            << " of " << round_nodes() << " finished, "
                            << std::chrono::duration_cast<std::chrono::seconds>(now - start).count() << " s";
        next_report = now + settings_.progress_interval;
      }
    }
  } catch (const StopRequested&) {
    throw;
  } catch (const Error& e) {
    return store_lost(e.what());
  }
}

std::optional<RoundEnd> NodeRendezvous::wait_joining(int round, const StopSignal& stop, const JoinPoll& poll,
                                                     const std::function<std::string()>& progress,
                                                     const std::function<std::string()>& missing) {
  const auto start = Clock::now();
  const auto deadline = start + settings_.timeouts.join_timeout;
  auto next_report = start + settings_.progress_interval;
  auto slice = kFirstJoinSlice;
  for (;;) {
    const JoinState state = poll(slice);
    slice = std::min(slice * 2, kMaxJoinSlice);
    if (state.end) return parse_round_end(*state.end);
    if (state.ready) return std::nullopt;
    // A spare that moved on to a round the world's nodes never came to: the job has ended.
    if (spare_) {
      if (auto over = job_ended()) return over;
    }
    if (stop.requested()) {
      // Leave cleanly: the others learn of it at once, not at the join timeout.
      report_signal(round, stop.signo());
      leave(round, std::chrono::seconds(5), stop);
      throw StopRequested(stop.signo());
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      throw TimeoutError("rendezvous (round " + std::to_string(round) + ") timed out after " +
                         seconds_text(settings_.timeouts.join_timeout) + ": " + missing() +
                         " (set the wait with --rdzv_conf join_timeout=SECONDS)");
    }
    if (now >= next_report) {
      // A steady, low rate (every 10 s by default) while nodes are missing.
      log::info("ddprun") << "rendezvous of job '" << settings_.run_id << "' (round " << round << "): " << progress()
                          << ", " << std::chrono::duration_cast<std::chrono::seconds>(now - start).count() << " s of "
                          << seconds_text(settings_.timeouts.join_timeout);
      next_report = now + settings_.progress_interval;
    }
  }
}

void NodeRendezvous::leave(int round, std::chrono::milliseconds timeout, const StopSignal& stop) {
  stop_watcher();
  stop_background();
  // The job goes on without this node (or never had it: a spare): its outcome is not the job's.
  if (departed_ || spare_) return;
  try {
    // The first node to leave records how the job ended: a later run of this job id sees it and
    // starts a new generation instead of joining this one.
    create_or_get(ended_key(), read(round_keys(round).end()).value_or(kLeftWithoutEnd));
    // A round that never completed: the nodes that joined it are the ones that will leave.
    int nodes = place().group_world_size;
    if (nodes <= 0) nodes = static_cast<int>(std::min<int64_t>(joined_nodes(round), settings_.max_nodes));
    if (tally(round, Tally::Left, true) >= nodes) forget_generation();
    linger(nodes, timeout, stop);
  } catch (const std::exception& e) {
    log::warn("ddprun") << "leaving the rendezvous (" << store_name() << "): " << e.what();
  }
}

std::string NodeRendezvous::new_agent_id(const std::string& host) {
  static std::atomic<uint64_t> next{std::random_device{}()};
  return host + ":" + std::to_string(::getpid()) + ":" + std::to_string(next++ % 100000);
}

namespace {
// A strike's value: an id unique to the call (so that the writer knows its own), a newline, why.
constexpr int kMostStrikes = 1000;
}  // namespace

std::vector<std::string> NodeRendezvous::unfit_leaves(int most) {
  std::vector<std::string> why;
  const rdzv::jobs::JobKeys keys = job_keys();
  try {
    for (int n = 1; n <= std::min(most, kMostStrikes); ++n) {
      const std::optional<std::string> strike = read(keys.unfit(settings_.host, n));
      if (!strike) break;
      const size_t newline = strike->find('\n');
      why.push_back(newline == std::string::npos ? "" : strike->substr(newline + 1));
    }
  } catch (const std::exception& e) {
    // The join that follows meets the same store and says what is wrong with it; a host is never
    // refused for a count that could not be read.
    log::warn("ddprun") << "reading this host's earlier leaves (" << store_name() << "): " << e.what();
    return {};
  }
  return why;
}

void NodeRendezvous::leave_unready(int round, const std::string& why, bool strike) {
  stop_watcher();
  if (strike) {
    try {
      // The first free slot of this host's strikes; a slot another node took first is passed over.
      const rdzv::jobs::JobKeys keys = job_keys();
      const std::string mine = new_agent_id(settings_.host) + "\n" + why;
      for (int n = 1; n <= kMostStrikes && create_or_get(keys.unfit(settings_.host, n), mine) != mine; ++n) {
      }
    } catch (const std::exception& e) {
      log::warn("ddprun") << "counting this host's leave (" << store_name() << "): " << e.what();
    }
  }
  if (!elastic() && settings_.node_rank >= 0) {
    rdzv::jobs::Outcome unready;
    unready.kind = rdzv::jobs::Outcome::Kind::NodeLost;
    unready.node = settings_.node_rank;
    unready.detail = "node " + std::to_string(settings_.node_rank) + " (" + settings_.host + ") " + why;
    try {
      decide(round, unready);
    } catch (const std::exception& e) {
      log::warn("ddprun") << "telling the other nodes (" << store_name() << "): " << e.what();
    }
  }
  stop_background();
}

std::unique_ptr<ProgressChannel> NodeRendezvous::progress_channel(int round) {
  const Place p = place();
  return open_progress_channel(round, p.group_rank, p.group_world_size);
}

void NodeRendezvous::set_place(Place p) {
  if (p.group_rank >= 0) spare_ = false;
  std::lock_guard lock(place_mutex_);
  place_ = std::move(p);
}

NodeRendezvous::Place NodeRendezvous::place() const {
  std::lock_guard lock(place_mutex_);
  return place_;
}

std::string NodeRendezvous::host_of(int g) const {
  std::lock_guard lock(place_mutex_);
  return g >= 0 && static_cast<size_t>(g) < place_.hosts.size() ? place_.hosts[static_cast<size_t>(g)] : "?";
}

void NodeRendezvous::stop_watcher() {
  stop_watching_ = true;
  if (watcher_.joinable()) watcher_.join();
}

}  // namespace ddprun::launcher::rendezvous
