#include "launcher/agent/run_agent.hpp"

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/agent/agent.hpp"
#include "launcher/agent/error_file.hpp"
#include "launcher/workers/console.hpp"

namespace ddprun::launcher::agent {

using cli::is_multi_node;
using cli::LaunchOptions;
using rendezvous::ProgressChannel;
using rendezvous::RoundEnd;
using rendezvous::World;
using workers::Consoles;
using workers::consoles;
using workers::ConsoleWriter;
using workers::format_failure_report;
using workers::GroupOutcome;
using workers::GroupResult;
using workers::WorkerExit;
using workers::WorkerLaunch;

void Agent::start_watch(int round) {
  // Another node's failure (or signal, or a membership change) stops this node's workers at once.
  backend_->watch(round, [this](const RoundEnd& end) {
    {
      std::lock_guard lock(seen_mutex_);
      seen_end_ = end;
    }
    if (end.kind != RoundEnd::Kind::Success) supervisor_.request_stop(end.detail);
  });
  watching_ = true;
}

std::variant<World, RoundEnd> Agent::rendezvous(int round) {
  auto joined = backend_->join(
      round, options_.nproc_per_node, [this] { return host_worker_store(); }, stop_);
  if (auto* w = std::get_if<World>(&joined)) {
    if (w->restarts > restarts_) {
      // This node came (back) into a job that has restarted already: --max_restarts is the job's.
      log::info("ddprun") << "the job has made " << w->restarts << " restart(s) of " << options_.max_restarts
                          << "; this node counts from there";
      restarts_ = w->restarts;
    }
    if (multi_node_ && worker_store_ && w->group_rank == 0) {
      // Now the job's nodes are known: their workers may connect, nobody else's.
      std::vector<std::string> peers = w->peer_addresses;
      peers.push_back(advertise_addr_);
      worker_store_->allow_peers(resolve_all(peers));
    }
    if (multi_node_) {
      log::info("ddprun") << "round " << w->round << " (restart " << restarts_ << "): node " << w->group_rank << " of "
                          << w->group_world_size << ", ranks " << w->rank_offset << ".."
                          << w->rank_offset + options_.nproc_per_node - 1 << " of " << w->world_size
                          << ", MASTER_ADDR=" << w->master_addr << " MASTER_PORT=" << w->master_port;
    } else {
      log::info("ddprun") << "attempt " << restarts_ << ": worker store on "
                          << rdzv::server::format_endpoint(worker_store_->endpoint())
                          << ", MASTER_ADDR=" << w->master_addr << " MASTER_PORT=" << w->master_port;
    }
  }
  return joined;
}

void Agent::on_hang(const RoundEnd& end) {
  // On the watchdog's thread. On several nodes the end is in the rendezvous too, and the watcher
  // of every node (this one included) stops its workers; this is the same end, seen first here.
  {
    std::lock_guard lock(seen_mutex_);
    if (seen_end_) return;
    seen_end_ = end;
  }
  health(StatusServer::Phase::Hung, end.detail);
  supervisor_.request_stop("the job hung: " + end.detail);
}

GroupResult Agent::running(const World& world) {
  attempt_dir_ = attempt_directory(world);
  watchdog_.reset();
  watchdog_ = make_watchdog(world, attempt_dir_);
  std::vector<WorkerLaunch> launches = make_launches(world, attempt_dir_, *watchdog_);
  {
    std::lock_guard lock(seen_mutex_);
    seen_end_.reset();
  }
  std::unique_ptr<ProgressChannel> channel;
  if (multi_node_) {
    try {
      channel = backend_->progress_channel(world.round);
    } catch (const std::exception& e) {
      log::warn("ddprun") << "hang watchdog: no connection to the rendezvous store (" << e.what()
                          << "): watching this node's ranks only";
    }
    start_watch(world.round);
  }
  // The worker store's changes are progress signals; it lives on the node of group rank 0.
  rdzv::server::ServerThread* store = !multi_node_ || world.group_rank == 0 ? worker_store_.get() : nullptr;
  if (store) start_relay(world);
  GroupResult result = supervisor_.run(launches, [&](const std::vector<pid_t>& pids) {
    ran_workers_ = true;
    health(StatusServer::Phase::Running,
           std::to_string(pids.size()) + " workers, round " + std::to_string(world.round) + " (restart " +
               std::to_string(restarts_) + ")",
           world.round);
    watchdog_->start(
        pids, store, std::move(channel), [this](const RoundEnd& end) { on_hang(end); },
        [this] {
          std::lock_guard lock(seen_mutex_);
          return supervisor_.group_running() && !seen_end_;
        });
  });
  watchdog_->stop();
  if (relay_ && result.outcome == GroupOutcome::Succeeded) {
    // Groups that come back after this one finished learn that the job is over, and from when.
    try {
      relay_->finish_job();
    } catch (const Error& e) {
      log::warn("ddprun") << "replica group " << *options_.replica_group << ": the job's end could not be recorded ("
                          << e.what() << "): a group that comes back later waits for a quorum until its timeout";
    }
  }
  stop_relay();
  fenced_ = false;
  if (const auto window = guard_.take_fenced()) {
    fenced_ = true;
    log::warn("ddprun") << "this node's guard stopped its workers: no heartbeat reached the rendezvous for "
                        << seconds_text(*window)
                        << " (ddprun was stopped, frozen or cut off), so the other nodes count this node as lost "
                           "and may go on without it";
  }
  // What the watchdog saw goes into the failure report.
  const auto notes = watchdog_->timer_notes();
  for (auto& f : result.failures) {
    if (auto it = notes.find(f.rank); it != notes.end()) f.diagnosis = it->second;
  }
  if (watchdog_->wrote_diagnosis()) run_dir_.keep();
  return result;
}

RoundEnd Agent::agree_on_end(const World& world, const GroupResult& result) {
  const int round = world.round;
  switch (result.outcome) {
    case GroupOutcome::Succeeded:
      if (multi_node_) {
        log::info("ddprun") << "this node's workers all finished; waiting for the other nodes to finish";
        health(StatusServer::Phase::Finishing, "this node's workers all finished; waiting for the other nodes");
      }
      return backend_->report_success(round, stop_);
    case GroupOutcome::Failed:
      // Fenced workers did not fail: this node fell out of the job. What the others decide (this
      // node lost, or the store gone) is the outcome.
      if (fenced_) return backend_->wait_end(round, stop_);
      if (multi_node_ && world.group_world_size > 1 && workers::lost_a_peer(result.failures.front())) {
        // The rank lost its connection to a peer, which is what a killed or cut-off node looks like
        // from here before its keep-alives have lapsed. Give the watchers that window to name the
        // lost node (or another node to report the failure that started it), so that the report
        // blames the cause and an elastic job goes on without counting a restart. (In a round of
        // one node the peer was outside the round, another replica group's say: nothing to wait for.)
        const auto window = options_.rdzv_timeouts.keep_alive_interval * options_.rdzv_timeouts.keep_alive_max_attempt +
                            std::chrono::seconds(1);
        log::info("ddprun") << "rank " << result.failures.front().rank
                            << " lost its connection to a peer: waiting up to " << seconds_text(window)
                            << " for the keep-alives to tell whether a node was lost";
        if (auto end = backend_->wait_end_for(round, window, stop_)) return *end;
      }
      return backend_->report_failure(round, result.failures.front(), progress_mark());
    case GroupOutcome::Signalled: return backend_->report_signal(round, result.signal);
    case GroupOutcome::StoppedByRequest: {
      // Stopped because the watcher saw the round end: use what it saw.
      std::lock_guard lock(seen_mutex_);
      if (seen_end_) return *seen_end_;
      break;
    }
  }
  return backend_->wait_end(round, stop_);
}

int Agent::finish(int round, const World& world, const RoundEnd& end, const GroupResult& result, int exit_code,
                  Decision::Why why) {
  report_.finish(&end, exit_code);
  report_.set_not_restarted(why);
  if (!run_dir_.temporary) report_.set_run_directory(run_dir_.path.string());
  view_event("exit", outcome_name(end.kind) + ", exit code " + std::to_string(exit_code));
  if (end.job_over) {
    // A spare: the nodes that ran the job have said what there is to say.
    const std::string what =
        "the job ended (" + outcome_name(end.kind) + (end.detail.empty() ? "" : ": " + end.detail) +
        ") while this node waited as a spare: " +
        (ran_workers_ ? "its workers ran in an earlier round, none since" : "no worker was started here");
    if (end.kind == RoundEnd::Kind::Success) {
      log::info("ddprun") << what;
    } else {
      log::warn("ddprun") << what;
    }
    backend_->leave(round, std::chrono::seconds(0), stop_);
    return exit_code;
  }
  switch (end.kind) {
    case RoundEnd::Kind::Success:
      if (multi_node_) {
        log::info("ddprun") << "all " << world.world_size << " worker(s) on " << world.group_world_size
                            << " nodes finished successfully";
      } else {
        log::info("ddprun") << "all " << options_.nproc_per_node << " worker(s) finished successfully";
      }
      break;
    case RoundEnd::Kind::Signal:
      log::warn("ddprun") << (multi_node_ ? "job stopped by " : "workers stopped by ") << end.detail;
      break;
    case RoundEnd::Kind::StoreLost:
      backend_->quiesce();
      log::error("ddprun") << end.detail;
      return exit_code;  // nothing to leave: the store is gone
    case RoundEnd::Kind::NodeLost:
      if (lost_here(end, world) && stop_.requested()) {
        log::warn("ddprun") << end.detail << (backend_->elastic() ? "; the other nodes go on without it" : "");
      } else {
        log::error("ddprun") << "job stopped: " << (lost_here(end, world) ? "this node was counted as lost: " : "")
                             << end.detail;
      }
      break;
    case RoundEnd::Kind::Membership:
      log::warn("ddprun") << "stopped during a re-rendezvous (" << end.detail << ")";
      break;
    case RoundEnd::Kind::Failure: {
      std::vector<WorkerExit> failures;
      if (end.root_cause) failures.push_back(*end.root_cause);
      for (const auto& f : result.failures) {
        if (!end.root_cause || f.rank != end.root_cause->rank) failures.push_back(f);
      }
      settle_error_files(failures, options_.launcher_error_file, run_dir_.temporary ? run_dir_.path.string() : "",
                         report_);
      const std::string report = format_failure_report(options_.program, failures, result.stopped_ranks);
      if (ConsoleWriter* err = consoles().err) err->write(report);
      break;
    }
    case RoundEnd::Kind::Hang:
      // The report is out already (show_hang_report).
      break;
  }
  if (const std::string why_text = not_restarted_text(end, why, options_.max_restarts); !why_text.empty())
    log::error("ddprun") << why_text;
  // A lost node never leaves: give the others a few seconds to read the outcome, not the full wait.
  backend_->leave(round, end.kind == RoundEnd::Kind::NodeLost ? std::chrono::seconds(5) : std::chrono::seconds(30),
                  stop_);
  return exit_code;
}

int Agent::run() {
  enum class State { Rendezvous, Running, Ending } state = State::Rendezvous;
  int round = 0;
  World world;
  GroupResult result;
  RoundEnd end;
  auto stopped_early = [this](int signo, const std::string& message) {
    log::warn("ddprun") << message;
    report_.finish(nullptr, 128 + signo, "signalled", message);
    return 128 + signo;
  };
  try {
    if (multi_node_) health(StatusServer::Phase::Connecting, "to the rendezvous");
    backend_ = make_backend();
    if (options_.replica_group) make_coordinator();
    backend_->on_joined([this](int joined_round, const std::string& detail) {
      health(StatusServer::Phase::Joined, detail + "; waiting for the other nodes", joined_round);
    });
    backend_->on_spare([this](int spare_round, const std::string& detail, const RoundEnd* ended) {
      report_.spare(spare_round, ended);
      if (ended) {
        view_event("spare", "round " + std::to_string(spare_round) + " " + outcome_name(ended->kind));
        return;
      }
      health(StatusServer::Phase::Spare, detail + "; waiting to take the place of a node that is lost", spare_round);
      if (health_) health_->view().set_identity(options_.run_id, host_, -1, options_.max_nodes);  // no place
      view_event("spare", "round " + std::to_string(spare_round) + ": waiting as a spare (" + detail + ")");
    });
    round = backend_->first_round(stop_);
  } catch (const StopRequested& s) {
    return stopped_early(s.signal(),
                         "received " + signal_name(s.signal()) + " before the rendezvous: no worker was started");
  }
  for (;;) {
    switch (state) {
      case State::Rendezvous: {
        std::variant<World, RoundEnd> joined;
        report_.rendezvous_began(round, restarts_);
        health(StatusServer::Phase::Rendezvous, "round " + std::to_string(round), round);
        view_event("rendezvous", "round " + std::to_string(round) + ": joining");
        backend_->set_restarts(restarts_);
        try {
          if (const auto unready = unready_for_round()) {
            log::error("ddprun") << "before round " << round << ", this node " << unready->why
                                 << ": it leaves the job before starting its workers";
            view_event("exit", unready->why);
            backend_->leave_unready(round, unready->why, unready->strike);
            report_.finish(nullptr, 1, unready->outcome, unready->why);
            return 1;
          }
          joined = rendezvous(round);
        } catch (const StopRequested& s) {
          return stopped_early(s.signal(), "received " + signal_name(s.signal()) +
                                               " during the rendezvous: left it; no worker was started");
        }
        if (auto* ended = std::get_if<RoundEnd>(&joined)) {
          // Another node stopped or failed before the round could start.
          end = *ended;
          result = GroupResult{};
          world = World{};
          world.group_rank = -1;  // no place in a round that never started
          report_.round_ended(end, result);
          state = State::Ending;
          break;
        }
        world = std::get<World>(joined);
        report_.group_started(world);
        view_round(world);
        round = world.round;  // a node arriving late joins the job's next round
        state = State::Running;
        break;
      }
      case State::Running:
        result = running(world);
        end = agree_on_end(world, result);
        learn_progress(end);
        report_.round_ended(end, result);
        view_event("end", "round " + std::to_string(world.round) + " " + outcome_name(end.kind) +
                              (end.detail.empty() ? "" : ": " + end.detail));
        print_rates();
        if (end.kind == RoundEnd::Kind::Hang) show_hang_report(world, end);
        state = State::Ending;
        break;
      case State::Ending: {
        if (watching_) {
          backend_->unwatch();
          watching_ = false;
        }
        if (const auto over = job_finished_elsewhere(end)) {
          log::warn("ddprun") << "replica group " << *options_.replica_group << ": " << over->describe()
                              << " while this group was away, and its workers ended with an error rather than "
                                 "leave when told so: not restarting them";
          return finish(round, world, end, result, 0);
        }
        const Decision d = decide(end, RestartState{restarts_, options_.max_restarts, backend_->elastic(),
                                                    stop_.signo(), result.signal, !result.unkillable.empty(),
                                                    options_.no_restart_exit_codes, options_.max_no_progress_restarts});
        if (d.why == Decision::Why::Unkillable) {
          log::error("ddprun") << "not "
                               << (end.kind == RoundEnd::Kind::Failure || end.kind == RoundEnd::Kind::Hang
                                       ? "restarting"
                                       : "joining the next round")
                               << ": " << result.unkillable.size()
                               << " worker(s) of this node could not be stopped and still hold what new workers "
                                  "would need; this node leaves the job";
        }
        if (d.kind == Decision::Kind::Finish) {
          if (end.kind != RoundEnd::Kind::Hang)
            health(StatusServer::Phase::Ending, "exit code " + std::to_string(d.exit_code));
          return finish(round, world, end, result, d.exit_code, d.why);
        }
        health(StatusServer::Phase::Restarting, end.detail.empty() ? "round " + std::to_string(round + 1) : end.detail);
        announce_next_round(d.kind, end, world);
        ++round;
        state = State::Rendezvous;
        break;
      }
    }
  }
}

namespace {

// A report file that cannot be written is found out before any worker runs, not after the job.
void check_report_path(const std::string& path) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (fs::is_directory(target, ec)) {
    throw ConfigError("--report_file " + path + " is a directory: give a file path, e.g. " +
                      (target / "ddprun-report.json").string());
  }
  // A report replaces a regular file (or a FIFO) at its path, never a device or anything else.
  if (const auto problem = report_path_problem(path)) {
    throw ConfigError("--report_file " + path + ": " + *problem +
                      ", which ddprun does not replace: give the path of a regular file, or of none yet");
  }
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  fs::create_directories(dir, ec);
  if (ec)
    throw ConfigError("--report_file " + path + ": cannot create its directory " + dir.string() + ": " + ec.message());
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw ConfigError("--report_file " + path + ": its directory " + dir.string() +
                      " is not writable: " + std::strerror(errno));
  }
}

// ddprun's own log lines, through the stderr console writer while the agent runs.
void log_to_console(std::string_view line) {
  if (ConsoleWriter* err = consoles().err) {
    err->write(line);
    return;
  }
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace

int run_agent(const LaunchOptions& o) {
  raise_open_file_limit();  // three descriptors per worker, and a store's clients
  auto notice = [](const char* stream) {
    return [stream] {
      log::warn("ddprun") << "the console (" << stream << ") is not keeping up: worker output is dropped (and counted) "
                          << "rather than held back; per-rank log files keep everything (--tee 3 --log_dir DIR)";
    };
  };
  ConsoleWriter out(STDOUT_FILENO, ConsoleWriter::kDefaultCapacity, notice("stdout"));
  ConsoleWriter err(STDERR_FILENO, ConsoleWriter::kDefaultCapacity, notice("stderr"));
  consoles() = Consoles{&out, &err};
  log::set_sink(&log_to_console);
  int code = 1;
  const bool multi_node = is_multi_node(o);
  JobReport report(o, host_name(), expand_report_path(o.report_file, host_name()), multi_node);
  try {
    check_report_path(report.path());
    Agent agent(o, report);
    code = agent.run();
    report.write();
  } catch (const std::exception& e) {
    // ddprun's own error (main prints it): the report says so too, with the exit code main returns,
    // and so does the error file of whatever started ddprun.
    report.finish(nullptr, dynamic_cast<const ConfigError*>(&e) ? 2 : 1, "error", e.what());
    report.write();
    write_launcher_error(o.launcher_error_file, e.what());
    log::set_sink(nullptr);
    consoles() = Consoles{};
    throw;
  } catch (...) {
    log::set_sink(nullptr);
    consoles() = Consoles{};
    throw;
  }
  const uint64_t dropped = out.dropped_bytes() + err.dropped_bytes();
  if (dropped > 0) {
    log::warn("ddprun") << dropped << " bytes of console output were dropped because the console did not keep up";
  }
  out.drain(std::chrono::seconds(2));
  err.drain(std::chrono::seconds(2));
  log::set_sink(nullptr);
  consoles() = Consoles{};
  return code;
}

}  // namespace ddprun::launcher::agent
