#pragma once
// One node's agent, as an explicit state machine:
//
//   Rendezvous --(joined)--> Running --(group ended)--> Ending --(restart, membership change)--> Rendezvous
//        |                                                 |
//        +--(stop signal: leave cleanly, start nothing)    +--(finished, failed, stopped)--> exit code
//
//   Rendezvous  joins the next round through the RendezvousBackend (one node, a store, etcd); the
//               node that becomes group rank 0 hosts the round's worker store.
//   Running     the Supervisor runs the worker group; a watcher thread (owned for the round, joined
//               before the next) stops it when another node ends the round.
//   Ending      agrees with the other nodes on how the round ended, then applies the one restart
//               policy: restart after a failure (up to --max_restarts), re-rendezvous after a
//               membership change or a lost node (elastic jobs), or finish with the report.
//
// Signals are caught by a thread of their own in every state: a stop signal wakes whatever the
// agent waits on (StopSignal) and stops the running workers (Supervisor::deliver_signal); other
// handled signals are forwarded to the workers. Console output goes through non-blocking writers
// (ConsoleWriter), so a console that does not keep up never blocks any of this.
//
// The Agent class is written in four files: agent_setup.cpp (its own set-up: the signals, the
// status server, the Python hook, the --preload zygote, NUMA placement), agent_rendezvous.cpp (how
// it meets the other nodes: the backend, the fence, the worker store it hosts), agent_launches.cpp
// (each round's workers: the attempt directory, the watchdog, every worker's launch) and agent.cpp
// (the state machine). Internal to the launcher (run_agent in run_agent.hpp is the way in);
// the unit tests drive Agent directly.

#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/stop_signal.hpp"
#include "common/unique_fd.hpp"
#include "launcher/agent/status_server.hpp"
#include "launcher/view/trace_file.hpp"
#include "launcher/agent/job_report.hpp"
#include "launcher/agent/restart_policy.hpp"
#include "launcher/cli/options.hpp"
#include "launcher/ft/coordinator.hpp"
#include "launcher/ft/relay.hpp"
#include "launcher/rendezvous/etcd/etcd_client.hpp"
#include "launcher/workers/process.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "launcher/workers/signals.hpp"
#include "launcher/workers/supervisor.hpp"
#include "launcher/watchdog/watchdog.hpp"
#include "launcher/workers/worker_env.hpp"
#include "launcher/workers/zygote.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::launcher::agent {

using cli::LaunchOptions;
using ddprun::StopSignal;
using rendezvous::RendezvousBackend;
using rendezvous::RoundEnd;
using rendezvous::World;
using watchdog::Watchdog;
using workers::Environment;
using workers::FilteredCopy;
using workers::GroupResult;
using workers::LineMerger;
using workers::OrphanGuard;
using workers::RankPlacement;
using workers::SignalWatcher;
using workers::SpawnedProcess;
using workers::SpawnRequest;
using workers::Supervisor;
using workers::WorkerLaunch;
using workers::Zygote;

namespace fs = std::filesystem;

std::string host_name();
// Creates `dir` (and missing parents) readable by this user alone: worker logs and error files
// hold whatever the workers print.
void create_private_directory(const fs::path& dir);
// The worker's argv: the program, through the Python interpreter for .py files and -m.
std::vector<std::string> worker_command(const LaunchOptions& o, const Environment& env);
// Every numeric address of `names` (addresses or host names), for an allow list.
std::vector<std::string> resolve_all(const std::vector<std::string>& names);

// Where attempt directories go: LOG_DIR/RUN_ID_XXXX, or a temporary directory removed at exit
// when nothing was asked to be kept. Private (0700), as is everything ddprun creates in it; made
// with mkdir (no link followed) in a directory that only this user (or root) can change, or a
// ConfigError: the workers run the Python hook from it.
//
// A temporary directory outlives a ddprun that cannot run its destructor (SIGKILL: the OOM killer,
// `scancel -9`). So ddprun holds an flock on `.lock` inside it for as long as it runs, and marks it
// `.temporary` once the lock is held; each new ddprun removes the marked directories of this user
// in the same temporary directory whose lock it can take (their owner is gone). keep() removes the
// marker: what was worth keeping is never swept.
struct RunDirectory {
  fs::path path;
  bool temporary = false;

  explicit RunDirectory(const LaunchOptions& o);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
  // Something worth keeping was written (stacks of a hang): the directory stays after the job.
  void keep();

 private:
  UniqueFd lock_fd_;
};

// Removes the temporary run directories (ddprun_*) in `parent` that belong to this user, are
// marked temporary and whose lock nobody holds; returns how many.
int sweep_abandoned_run_directories(const fs::path& parent);

// One node's agent: the state machine above and what it keeps between rounds.
class Agent {
 public:
  // `report` records the job as it goes (--report_file); the caller writes it.
  Agent(const LaunchOptions& o, JobReport& report);
  ~Agent();
  int run();

 private:
  void on_signal(int signo);
  std::unique_ptr<RendezvousBackend> make_backend();
  // --rdzv_backend etcd: the client's endpoints, credentials and TLS files.
  rendezvous::etcd::Options etcd_client_options() const;
  // Multi-node jobs: the guard stops this node's workers when no heartbeat got through for most of
  // `lost_after`, the time after which the other nodes count this node as lost.
  void arm_fence(std::chrono::milliseconds lost_after);
  std::optional<rdzv::core::Token> read_token() const;
  void plan_numa_binding();
  // --preload: the zygote starts importing now (overlapping the rendezvous); spawn_worker forks
  // workers from it, or starts them the normal way when it cannot serve (said once).
  void start_zygote();
  SpawnedProcess spawn_worker(const SpawnRequest& request);
  rendezvous::HostedStore host_worker_store();
  fs::path attempt_directory(const World& world) const;
  std::vector<WorkerLaunch> make_launches(const World& world, const fs::path& attempt_dir, const Watchdog& watchdog);
  std::unique_ptr<Watchdog> make_watchdog(const World& world, const fs::path& attempt_dir);
  void on_hang(const RoundEnd& end);
  // Whether `end` is this node counted as lost by the others (it was cut off or frozen).
  bool lost_here(const RoundEnd& end, const World& world) const;
  void start_watch(int round);
  // The states.
  std::variant<World, RoundEnd> rendezvous(int round);
  GroupResult running(const World& world);
  RoundEnd agree_on_end(const World& world, const GroupResult& result);
  // What this node says of the job's progress as it reports a failure, and what it learns of it
  // from the round's end as decided (--max_no_progress_restarts).
  rendezvous::ProgressMark progress_mark() const;
  // Before a round: a worker's request that this node leave the job (the file it wrote at
  // DDPRUN_EXCLUDE_NODE_FILE), then the health checks (node_checks.hpp): the first reason found.
  struct Unready {
    std::string outcome;  // the report's: "node_excluded", "node_check_failed", "node_not_taken_back"
    std::string why;
    bool strike = true;  // counts among the host's leaves unfit (--max_unfit_leaves)
  };
  std::optional<Unready> unready_for_round();
  std::filesystem::path exclusion_file() const { return run_dir_.path / "exclude_node"; }
  void learn_progress(const RoundEnd& end);
  // `why`: what kept a failed or hung round from a restart (Decision::Why::Ended: it was not one).
  int finish(int round, const World& world, const RoundEnd& end, const GroupResult& result, int exit_code,
             Decision::Why why = Decision::Why::Ended);
  // A restart or a re-rendezvous decided: counts a restart, and says why the next round comes.
  void announce_next_round(Decision::Kind kind, const RoundEnd& end, const World& world);
  void print_rates();
  void show_hang_report(const World& world, const RoundEnd& end);

  const LaunchOptions& options_;
  JobReport& report_;
  const bool multi_node_;
  StopSignal stop_;
  OrphanGuard guard_;  // before any thread or socket exists, so it inherits nothing worth keeping
  std::chrono::milliseconds fence_window_{0};  // multi-node jobs: see arm_fence
  bool fenced_ = false;
  // Elastic jobs: CLOCK_MONOTONIC ns until which this node's place in the job is confirmed (the
  // fence's window from the last heartbeat taken); the workers' progress pages carry it.
  std::atomic<uint64_t> membership_until_ns_{0};
  void confirm_membership();  // the guard stopped the last group's workers
  Environment base_env_;
  std::string host_;
  std::string signals_text_;
  std::optional<std::vector<std::string>> gpus_;
  std::string gpu_variable_ = "CUDA_VISIBLE_DEVICES";  // how a worker is told its GPU
  std::vector<RankPlacement> placements_;              // --numa_binding, by local rank
  bool omp_threads_per_rank_ = false;                  // OMP_NUM_THREADS was not set: each rank gets its share
  RunDirectory run_dir_;
  Supervisor supervisor_;
  std::unique_ptr<SignalWatcher> signals_;  // after supervisor_: destroyed (joined) before it
  std::unique_ptr<RendezvousBackend> backend_;
  std::unique_ptr<rdzv::server::ServerThread> worker_store_;
  std::string advertise_addr_;  // the address other nodes (and the workers) use for this node
  // Stack capture (for --hang_timeout and torchelastic's file timer): the workers' Python hook.
  const bool file_timer_;
  const bool capture_stacks_;
  std::string timer_file_;
  std::string python_hook_dir_;
  std::unique_ptr<view::TraceFile> trace_;  // --trace_file (before watchdog_: it outlives its ticks)
  std::unique_ptr<Watchdog> watchdog_;      // the current round's
  std::unique_ptr<StatusServer> health_;    // TORCHELASTIC_HEALTH_CHECK_PORT
  void health(StatusServer::Phase phase, std::string detail, int round = -1) {
    if (health_) health_->set(phase, std::move(detail), round);
  }
  // The job page's timeline (with the report as it stands) and the trace, when there are.
  void view_event(const char* kind, std::string text);
  // A round starts: who is in it.
  void view_round(const World& world);
  // The supervisor begins to stop the workers (Supervisor::set_on_stopping): the page says why,
  // and names a failure as the root cause, while they take their grace to exit.
  void view_stopping(const GroupResult& so_far);
  // The program and its arguments, cut to `most` characters, for people to read.
  std::string command_line(size_t most) const;
  int view_nodes_ = 0;  // the previous round's node count, for the timeline
  fs::path attempt_dir_;
  int restarts_ = 0;
  bool ran_workers_ = false;  // this node started workers in some round (a spare since, it says so)
  // The job's progress as the failures' ends said it: the most iterations reported before (none
  // yet: nothing known), and the restarts in a row that got no further.
  std::optional<uint64_t> best_iterations_;
  int no_progress_restarts_ = 0;
  bool looked_for_strikes_ = false;  // this host's earlier leaves unfit, looked at before the first round
  bool watching_ = false;
  std::mutex seen_mutex_;
  std::optional<RoundEnd> seen_end_;  // the round's end as the watcher saw it
  // --replica_group: this group's member of the job's quorum (for the agent's life), and the relay
  // between its workers and the quorum (for a round, on the node that hosts the worker store).
  std::unique_ptr<ft::Coordinator> coordinator_;
  std::unique_ptr<ft::Relay> relay_;
  void make_coordinator();
  void start_relay(const World& world);
  // The round's workers are gone: the relay stops and the quorum counts this group out at once.
  void stop_relay();
  // The job's end, when this round's workers were told that the job was over (another replica
  // group finished it) and the round ended in a failure (a worker that did not leave when told so):
  // nothing to restart.
  std::optional<ft::Finished> job_finished_elsewhere(const RoundEnd& end) const;
  std::unique_ptr<Zygote> zygote_;  // --preload; last: gone before the run directory
  bool zygote_announced_ = false;
};

}  // namespace ddprun::launcher::agent
