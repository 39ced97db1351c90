#pragma once
// Runs one worker group (the workers of one node for one attempt) to its end: spawns the workers,
// reaps them as they exit (SIGCHLD, no polling), streams their output (to non-blocking console
// writers and to log files), and on the first failure or a stop signal terminates every worker's
// process group (the signal, then SIGKILL after the grace).
//
// Single-threaded: everything happens on the Supervisor's io_context, driven by run(). Signals and
// stop requests come from other threads through deliver_signal() and request_stop(), which post to
// that loop; a stop signal that arrives between two runs is remembered, so the next run starts no
// worker. A worker that cannot be started is a failure like any other: the ones already started
// are stopped and reaped, and the report names the one that could not start.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/defaults.hpp"
#include "launcher/workers/output.hpp"
#include "launcher/workers/process.hpp"
#include "launcher/workers/report.hpp"

namespace ddprun::launcher::workers {

// One worker to start.
struct WorkerLaunch {
  int local_rank = 0;
  int rank = 0;
  SpawnRequest request;
  std::string prefix;  // console line prefix
  bool stdout_to_console = true;
  bool stderr_to_console = true;
  std::string stdout_file;  // "" = none
  std::string stderr_file;
  std::string error_file;
  // The copies of filtered lines (--duplicate_*_filters), shared by the group's ranks; null for none.
  std::shared_ptr<FilteredCopy> stdout_filtered;
  std::shared_ptr<FilteredCopy> stderr_filtered;
  // --merge_lines: the node's mergers of console lines, shared by the group's ranks; null for none.
  std::shared_ptr<LineMerger> stdout_merger;
  std::shared_ptr<LineMerger> stderr_merger;
};

enum class GroupOutcome {
  Succeeded,         // every worker exited 0
  Failed,            // a worker failed; failures[0] is the root cause
  Signalled,         // ddprun received a stop signal and stopped the workers
  StoppedByRequest,  // request_stop() was called (e.g. another node failed)
};

// A worker that SIGKILL did not end within SupervisorSettings::kill_wait: asleep in the kernel where
// no signal reaches it (uninterruptible sleep, "D": a hung GPU driver, an NFS or FUSE server that does
// not answer, RDMA). ddprun leaves it behind rather than wait for it without end.
struct UnkillableWorker {
  WorkerExit worker;  // who it is (rank, host, node, pid); it has not ended
  char state = '?';   // /proc/<pid>/stat's state when ddprun gave up on it
  std::string wchan;  // the kernel function it sleeps in, "" when unknown
};

struct GroupResult {
  GroupOutcome outcome = GroupOutcome::Succeeded;
  std::vector<WorkerExit> failures;          // in order of occurrence
  std::vector<int> stopped_ranks;            // ranks ddprun terminated
  std::vector<WorkerExit> exits;             // every worker's end (one that could not start included), in order
  int signal = 0;                            // for Signalled
  std::string stop_reason;                   // for StoppedByRequest: request_stop()'s reason
  std::vector<UnkillableWorker> unkillable;  // left behind, still alive, after SIGKILL
};

struct SupervisorSettings {
  std::chrono::milliseconds shutdown_grace{std::chrono::seconds(30)};
  std::string host;
  int node_rank = -1;  // shown in reports of multi-node jobs
  size_t stderr_tail_lines = 12;
  // While workers are being stopped: a line saying who is still running, at this steady rate.
  std::chrono::milliseconds progress_interval{defaults::kProgressInterval};
  // A worker that failed: the verdict waits at most this long before ddprun stops the others (not at
  // all once the failure is known to be its own: Supervisor::settle_if_known). A stop
  // signal ddprun did not send (SIGTERM, SIGINT, SIGHUP, SIGQUIT) may be on its way to ddprun, since
  // Slurm's scancel, systemd's stop and a kill of a whole cgroup signal every process at once: one
  // of ddprun's own in that time makes it the job being stopped rather than a worker failing. And a
  // rank that failed because a peer went away (a collective's "Connection closed by peer") often
  // ends before that peer does: the peer's own failure in that time comes first in the report.
  std::chrono::milliseconds stop_signal_hold{std::chrono::seconds(1)};
  // After SIGKILL: how long a worker may take to exit (a large address space or a GPU context takes
  // seconds to tear down) before it is reported as unkillable and left behind (--kill_timeout).
  std::chrono::milliseconds kill_wait{std::chrono::seconds(30)};
};

class Supervisor {
 public:
  Supervisor(SupervisorSettings settings, OrphanGuard* guard);
  ~Supervisor();

  // Starts the workers and returns when all have ended (or at once, Signalled, if a stop signal
  // came first). `on_started` runs once the workers are started, with their pids in the order of
  // `workers` (-1 for one that could not be started).
  GroupResult run(const std::vector<WorkerLaunch>& workers,
                  const std::function<void(const std::vector<pid_t>&)>& on_started = {});

  // How workers are started: spawn_process unless set (--preload forks them from a zygote).
  using Spawner = std::function<SpawnedProcess(const SpawnRequest&)>;
  void set_spawner(Spawner spawner) { spawner_ = std::move(spawner); }
  // Told at once, on the supervisor's thread, when a worker fails on its own (before the failure is
  // held a moment for a root cause among others): what outside the group must learn it early (a
  // replica group leaves its job's quorum). It must not block for long.
  void set_on_failure(std::function<void(const WorkerExit&)> fn) { on_failure_ = std::move(fn); }
  // Told on the supervisor's thread when it begins to stop the group (a failure settled, a stop
  // signal, request_stop()), with the result so far: the outcome and the failures in order, the
  // root cause first, each with its stderr tail as read so far. What shows the job (its page)
  // learns there why the workers stop while they take their grace to exit. It must not block.
  void set_on_stopping(std::function<void(const GroupResult&)> fn) { on_stopping_ = std::move(fn); }

  // Thread-safe. Whether a group runs and is not being stopped.
  bool group_running() const { return running_.load(std::memory_order_acquire); }

  // Thread-safe. Stops the running group (SIGTERM, SIGKILL after the grace); run() then returns
  // StoppedByRequest. Ignored when no group is running.
  void request_stop(const std::string& reason);
  // Thread-safe. A signal ddprun received: stop signals stop the group (a second SIGINT kills it at
  // once); the other handled signals are forwarded to every worker's process group.
  void deliver_signal(int signo);

  // A stop signal (SIGINT/SIGTERM/SIGHUP/SIGQUIT) has arrived; the job must not be restarted.
  bool stop_signal_received() const { return stop_signal_ != 0; }
  int stop_signal() const { return stop_signal_; }

 private:
  struct Worker;
  enum class State { Idle, Running, Stopping };

  void arm_sigchld();
  // A worker that could not be started: recorded as its failure; the started ones are stopped.
  void spawn_failed(const WorkerLaunch& launch, const std::string& why);
  void on_signal(int signo);
  void reap();
  void on_worker_exit(Worker& w, int status);
  // A failure is held while a stop signal or the failure it follows from may come
  // (SupervisorSettings::stop_signal_hold); settle_held() turns what was held into failures, causes
  // before lost peers (no signal came: the group is stopped), or stopped ranks (one did). Callers
  // then call maybe_finish(). The hold ends at once when a held failure is known to be its rank's
  // own (settle_if_known): its stderr read to the end, no stop signal, no lost peer in what it said;
  // its callers too call maybe_finish() once they are done with the group.
  void hold_failure(WorkerExit e);
  void settle_held(bool stopped);
  void settle_if_known();
  WorkerExit with_tail(const WorkerExit& e) const;  // e with its worker's stderr tail as read so far
  void read_pipe(Worker& w, bool err);
  void begin_stop(int signo, GroupOutcome outcome);
  void report_stop_progress();
  void kill_all(int signo);
  // The record of `launch`'s worker (pid -1: none was started): who and where, its end still blank.
  WorkerExit exit_record(const WorkerLaunch& launch, pid_t pid) const;
  // SIGKILL to every worker left, and the kill_wait after which those still alive are given up.
  void kill_now();
  void give_up_unkillable();
  void maybe_finish();
  void set_state(State state) {
    state_ = state;
    running_.store(state == State::Running, std::memory_order_release);
  }

  SupervisorSettings settings_;
  OrphanGuard* guard_;
  Spawner spawner_;
  std::function<void(const WorkerExit&)> on_failure_;
  std::function<void(const GroupResult&)> on_stopping_;
  boost::asio::io_context io_{1};
  boost::asio::signal_set sigchld_;
  boost::asio::steady_timer grace_timer_;
  boost::asio::steady_timer drain_timer_;
  boost::asio::steady_timer progress_timer_;
  boost::asio::steady_timer hold_timer_;
  boost::asio::steady_timer kill_timer_;
  std::vector<WorkerExit> held_;  // failures waiting for the verdict, in order
  std::chrono::steady_clock::time_point stop_began_;
  int stop_signo_ = 0;
  bool killed_ = false;  // SIGKILL sent to the group
  std::vector<std::unique_ptr<Worker>> workers_;
  State state_ = State::Idle;
  std::atomic<bool> running_{false};
  GroupResult result_;
  std::atomic<int> stop_signal_{0};
  int sigint_count_ = 0;
  bool finished_ = false;
};

}  // namespace ddprun::launcher::workers
