#include "launcher/workers/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/procfs.hpp"
#include "common/system.hpp"
#include "launcher/workers/console.hpp"
#include "launcher/workers/output_file.hpp"
#include "launcher/workers/signals.hpp"
#include "launcher/workers/supervisor_worker.hpp"

namespace ddprun::launcher::workers {

namespace asio = boost::asio;

namespace {

// The rank's log file for one stream, or -1 for none; a file that cannot be created (a full disk,
// say) is a warning, and the stream goes to the console instead: its output is never lost.
LineWriter::Sinks log_sinks(const WorkerLaunch& l, const std::string& path, ConsoleWriter* console, bool to_console,
                            std::shared_ptr<FilteredCopy> filtered, std::shared_ptr<LineMerger> merger) {
  LineWriter::Sinks s;
  s.filtered = std::move(filtered);
  s.merger = std::move(merger);
  s.rank = l.rank;
  s.local_rank = l.local_rank;
  s.console = console;
  s.to_console = to_console;
  s.file_name = "rank " + std::to_string(l.rank) + "'s log file " + path;
  if (path.empty()) return s;
  // Private: a worker's output is its own business. In ddprun's own directory, so anything but a
  // regular file there (a FIFO, which would block the open or the writes) was put there by someone.
  OpenedOutput file = open_output(path, OutputRules{true, false});
  s.file_fd = std::move(file.fd);
  if (!s.file_fd) {
    log::warn("ddprun") << "cannot write " << s.file_name << ": " << file.error
                        << "; its lines go to the console instead";
    s.to_console = true;
  }
  return s;
}

}  // namespace

Supervisor::Supervisor(SupervisorSettings settings, OrphanGuard* guard)
    : settings_(std::move(settings)),
      guard_(guard),
      sigchld_(io_, SIGCHLD),
      grace_timer_(io_),
      drain_timer_(io_),
      progress_timer_(io_),
      hold_timer_(io_),
      kill_timer_(io_) {
  arm_sigchld();
}

Supervisor::~Supervisor() = default;

void Supervisor::deliver_signal(int signo) {
  if (is_stop_signal(signo)) {
    int none = 0;
    stop_signal_.compare_exchange_strong(none, signo);  // the first stop signal is the job's
  }
  asio::post(io_, [this, signo] { on_signal(signo); });
}

void Supervisor::arm_sigchld() {
  sigchld_.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    reap();
    arm_sigchld();
  });
}

void Supervisor::on_signal(int signo) {
  if (signo == SIGINT) ++sigint_count_;
  if (!is_stop_signal(signo)) {
    if (state_ == State::Idle) return;  // no workers to forward it to
    log::info("ddprun") << "forwarding " << signal_name(signo) << " to " << workers_.size() << " worker(s)";
    for (auto& w : workers_) {
      if (!w->exited) ::kill(-w->pid, signo);
    }
    return;
  }
  if (state_ == State::Running) {
    log::warn("ddprun") << "received " << signal_name(signo) << ": forwarding it to every worker, SIGKILL in "
                        << static_cast<double>(settings_.shutdown_grace.count()) / 1000.0
                        << "s (Ctrl-C again to kill now)";
    settle_held(/*stopped=*/true);
    begin_stop(signo, GroupOutcome::Signalled);
    result_.signal = signo;
    maybe_finish();
  } else if (state_ == State::Stopping && signo == SIGINT && sigint_count_ >= 2) {
    log::warn("ddprun") << "second SIGINT: killing every worker now";
    kill_now();
  }
}

void Supervisor::begin_stop(int signo, GroupOutcome outcome) {
  set_state(State::Stopping);
  result_.outcome = outcome;
  for (auto& w : workers_) {
    if (!w->exited) w->stopped_by_us = true;
  }
  kill_all(signo);
  stop_began_ = std::chrono::steady_clock::now();
  stop_signo_ = signo;
  grace_timer_.expires_after(settings_.shutdown_grace);
  grace_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    int alive = 0;
    for (auto& w : workers_) alive += w->exited ? 0 : 1;
    if (alive > 0) {
      log::warn("ddprun") << alive << " worker(s) still running after the "
                          << static_cast<double>(settings_.shutdown_grace.count()) / 1000.0
                          << "s grace: sending SIGKILL";
      kill_now();
    }
  });
  report_stop_progress();
  if (on_stopping_) {
    GroupResult so_far = result_;
    for (WorkerExit& f : so_far.failures) f = with_tail(f);
    on_stopping_(so_far);
  }
}

void Supervisor::report_stop_progress() {
  progress_timer_.expires_after(settings_.progress_interval);
  progress_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || finished_) return;
    std::string who;
    int alive = 0, listed = 0;
    for (auto& w : workers_) {
      if (w->exited) continue;
      ++alive;
      if (++listed <= 8) {
        who += (who.empty() ? "" : ", ") + std::string("rank ") + std::to_string(w->launch.rank) + " (pid " +
               std::to_string(w->pid) + ")";
      }
    }
    if (alive == 0) return;  // only output left to drain, bounded by the drain timer
    if (listed > 8) who += " and " + std::to_string(listed - 8) + " more";
    const auto waited =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - stop_began_).count();
    auto line = log::info("ddprun");
    line << "waiting for " << alive << " of " << workers_.size() << " worker(s) to exit after "
         << signal_name(killed_ ? SIGKILL : stop_signo_) << ": " << who << "; " << waited << " s";
    if (!killed_) line << " of " << seconds_text(settings_.shutdown_grace) << ", then SIGKILL";
    report_stop_progress();
  });
}

void Supervisor::kill_now() {
  kill_all(SIGKILL);
  if (killed_) return;  // the wait runs from the first SIGKILL
  killed_ = true;
  kill_timer_.expires_after(settings_.kill_wait);
  kill_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) give_up_unkillable();
  });
}

void Supervisor::give_up_unkillable() {
  reap();  // one that has just ended is an exit, not a process left behind
  bool gave_up = false;
  for (auto& w : workers_) {
    if (w->exited) continue;
    const auto st = procfs::read_stat(w->pid);
    if (st && st->state == 'Z') continue;  // dead, its exit status on its way (SIGCHLD)
    UnkillableWorker u{exit_record(w->launch, w->pid), st ? st->state : '?', procfs::wait_channel(w->pid)};
    auto line = log::error("ddprun");
    line << "worker rank " << u.worker.rank << " (pid " << u.worker.pid << ") did not exit "
         << seconds_text(settings_.kill_wait) << " after SIGKILL: it is " << procfs::state_name(u.state);
    if (!u.wchan.empty()) line << " in the kernel's " << u.wchan;
    line << ", a wait no signal ends (a hung GPU driver, an NFS or FUSE server that does not answer, RDMA). "
            "ddprun leaves it behind and does not start workers here again; what it holds (GPU memory, "
            "ports, files) stays held until the kernel lets it go, which may take a reboot of this host";
    result_.unkillable.push_back(std::move(u));
    // Given up: no longer waited for, nor its output (it holds the pipes open).
    w->exited = true;
    if (guard_) guard_->forget_group(w->pid);
    boost::system::error_code ignored;
    if (w->out_open) w->out_pipe.close(ignored);
    if (w->err_open) w->err_pipe.close(ignored);
    w->out_open = w->err_open = false;
    gave_up = true;
  }
  if (gave_up) maybe_finish();
}

WorkerExit Supervisor::exit_record(const WorkerLaunch& launch, pid_t pid) const {
  WorkerExit e;
  e.rank = launch.rank;
  e.local_rank = launch.local_rank;
  e.host = settings_.host;
  e.node_rank = settings_.node_rank;
  e.pid = pid;
  return e;
}

void Supervisor::kill_all(int signo) {
  for (auto& w : workers_) {
    // The whole process group: grandchildren (data loader workers, shells) go too.
    if (!w->exited && ::kill(-w->pid, signo) != 0 && errno == ESRCH) ::kill(w->pid, signo);
  }
}

void Supervisor::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (pid < 0 && errno == EINTR) continue;
      return;  // 0: nothing more now; ECHILD: no children
    }
    for (auto& w : workers_) {
      if (w->pid == pid && !w->exited) {
        on_worker_exit(*w, status);
        break;
      }
    }
    // Other pids are orphaned grandchildren handed to us as subreaper: just collected.
  }
}

void Supervisor::on_worker_exit(Worker& w, int status) {
  w.exited = true;
  const auto now = std::chrono::system_clock::now();
  // Grandchildren die with their worker.
  ::kill(-w.pid, SIGKILL);
  if (guard_) guard_->forget_group(w.pid);
  WorkerExit e = exit_record(w.launch, w.pid);
  e.time = now;
  e.error_file = w.launch.error_file;
  if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  else e.exit_code = WEXITSTATUS(status);
  const bool failed = e.signal != 0 || e.exit_code != 0;
  // Read here, once, for every reader after (the hold, the reports, the other nodes).
  if (failed) read_error_file(e);
  result_.exits.push_back(e);
  // Killed by the guard, this node having fallen out of the job: no rank failed, the agent says why.
  // The guard's SIGKILL names it even when a stop of ours came first: resumed from a freeze, ddprun
  // can read the round's end (this node lost) before it reaps the worker the guard killed meanwhile.
  const bool by_guard = failed && e.signal == SIGKILL && guard_ && guard_->fenced();
  const bool fenced = by_guard && !w.stopped_by_us;
  if (failed || log::enabled(log::Level::Debug)) {
    (failed && !w.stopped_by_us && !fenced ? log::warn("ddprun") : log::info("ddprun"))
        << "worker rank " << e.rank << " (pid " << e.pid << ") ended with " << describe_exit(e)
        << (by_guard ? ": stopped by this node's guard" : "");
  }
  if (failed && !w.stopped_by_us && on_failure_) on_failure_(e);
  if (fenced) {
    result_.failures.push_back(std::move(e));
    if (state_ == State::Running) begin_stop(SIGTERM, GroupOutcome::Failed);
  } else if (failed && !w.stopped_by_us && state_ == State::Running) {
    hold_failure(std::move(e));
  } else if (failed && !w.stopped_by_us) {
    result_.failures.push_back(std::move(e));
    if (state_ == State::Running) {
      log::warn("ddprun") << "rank " << w.launch.rank << " failed: stopping the other workers";
      begin_stop(SIGTERM, GroupOutcome::Failed);
    }
  } else if (w.stopped_by_us) {
    result_.stopped_ranks.push_back(w.launch.rank);
  }
  bool all_exited = std::all_of(workers_.begin(), workers_.end(), [](auto& x) { return x->exited; });
  if (all_exited) {
    grace_timer_.cancel();
    // Output still in the pipes is read; a grandchild that escaped the group may hold a pipe open,
    // so draining is bounded.
    drain_timer_.expires_after(std::chrono::seconds(2));
    drain_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (auto& x : workers_) {
        boost::system::error_code ignored;
        if (x->out_open) x->out_pipe.close(ignored);
        if (x->err_open) x->err_pipe.close(ignored);
      }
      maybe_finish();
    });
  }
  maybe_finish();
}

void Supervisor::read_pipe(Worker& w, bool err) {
  auto& pipe = err ? w.err_pipe : w.out_pipe;
  auto& buf = err ? w.err_buf : w.out_buf;
  pipe.async_read_some(asio::buffer(buf), [this, &w, err](const boost::system::error_code& ec, size_t n) {
    auto& writer = err ? w.err : w.out;
    if (!ec) {
      writer->feed(std::string_view((err ? w.err_buf : w.out_buf).data(), n));
      read_pipe(w, err);
      return;
    }
    writer->finish();
    (err ? w.err_open : w.out_open) = false;
    boost::system::error_code ignored;
    (err ? w.err_pipe : w.out_pipe).close(ignored);
    if (err && w.exited) settle_if_known();  // a held failure's stderr is complete now
    maybe_finish();
  });
}

void Supervisor::maybe_finish() {
  if (finished_ || !held_.empty()) return;
  for (auto& w : workers_) {
    if (!w->exited || w->out_open || w->err_open) return;
  }
  finished_ = true;
  drain_timer_.cancel();
  grace_timer_.cancel();
  progress_timer_.cancel();
  hold_timer_.cancel();
  kill_timer_.cancel();
  // The tails are complete now: attach them to the failures.
  for (auto& f : result_.failures) {
    for (auto& w : workers_) {
      if (w->launch.rank == f.rank) f.stderr_tail.assign(w->err->tail().begin(), w->err->tail().end());
    }
  }
  std::sort(result_.stopped_ranks.begin(), result_.stopped_ranks.end());
  io_.stop();
}

void Supervisor::spawn_failed(const WorkerLaunch& l, const std::string& why) {
  WorkerExit e = exit_record(l, -1);
  e.exit_code = 127;  // the shell's "could not be run"
  e.time = std::chrono::system_clock::now();
  e.error_text = "could not be started: " + why;
  log::error("ddprun") << "worker rank " << l.rank << " could not be started: " << why;
  result_.exits.push_back(e);
  result_.failures.push_back(std::move(e));
  if (!workers_.empty()) {
    log::warn("ddprun") << "stopping the " << workers_.size() << " worker(s) already started";
    begin_stop(SIGTERM, GroupOutcome::Failed);
  } else {
    set_state(State::Stopping);
    result_.outcome = GroupOutcome::Failed;
  }
}

GroupResult Supervisor::run(const std::vector<WorkerLaunch>& launches,
                            const std::function<void(const std::vector<pid_t>&)>& on_started) {
  workers_.clear();
  result_ = GroupResult{};
  set_state(State::Idle);
  finished_ = false;
  // Nothing of the previous group acts on this one: its timers' handlers run now, as cancelled.
  for (auto* t : {&drain_timer_, &grace_timer_, &progress_timer_, &hold_timer_, &kill_timer_}) t->cancel();
  io_.restart();
  // Requests posted after the previous group ended find no group running and are dropped here;
  // signals are remembered in stop_signal_.
  io_.poll();
  io_.restart();
  if (stop_signal_ != 0) {  // a stop signal came before the workers started
    result_.outcome = GroupOutcome::Signalled;
    result_.signal = stop_signal_;
    return result_;
  }
  killed_ = false;
  set_state(State::Running);
  for (const WorkerLaunch& l : launches) {
    auto w = std::make_unique<Worker>(io_, l);
    SpawnedProcess p;
    try {
      Consoles& c = consoles();
      w->out = std::make_unique<LineWriter>(
          l.prefix, log_sinks(l, l.stdout_file, c.out, l.stdout_to_console, l.stdout_filtered, l.stdout_merger), 0);
      w->err = std::make_unique<LineWriter>(
          l.prefix, log_sinks(l, l.stderr_file, c.err, l.stderr_to_console, l.stderr_filtered, l.stderr_merger),
          settings_.stderr_tail_lines);
      p = spawner_ ? spawner_(l.request) : spawn_process(l.request);
    } catch (const std::exception& e) {
      // Out of descriptors (pipe2), processes (fork), a program that cannot be executed: a failure
      // of this rank like any other, so the ones already started are stopped and reaped.
      spawn_failed(l, e.what());
      break;
    }
    w->pid = p.pid;
    if (guard_) guard_->watch_group(p.pid);
    w->out_pipe.assign(p.stdout_fd.release());
    w->err_pipe.assign(p.stderr_fd.release());
    w->out_open = w->err_open = true;
    DDPRUN_LOG_DEBUG("ddprun") << "worker rank " << l.rank << " started, pid " << p.pid;
    workers_.push_back(std::move(w));
  }
  if (!workers_.empty()) {
    log::info("ddprun") << "started " << workers_.size() << " worker(s), pids " << workers_.front()->pid << ".."
                        << workers_.back()->pid;
  }
  if (on_started) {
    std::vector<pid_t> pids(launches.size(), -1);
    for (size_t i = 0; i < workers_.size(); ++i) pids[i] = workers_[i]->pid;
    on_started(pids);
  }
  for (auto& w : workers_) {
    read_pipe(*w, false);
    read_pipe(*w, true);
  }
  reap();  // a worker that exited before SIGCHLD was being watched
  maybe_finish();
  if (!finished_) io_.run();
  set_state(State::Idle);
  GroupResult r = std::move(result_);
  if (r.outcome == GroupOutcome::Succeeded && !r.failures.empty()) r.outcome = GroupOutcome::Failed;
  workers_.clear();
  // Every stream has ended: what --merge_lines holds goes out now, before the report.
  for (const WorkerLaunch& l : launches) {
    if (l.stdout_merger) l.stdout_merger->flush();
    if (l.stderr_merger) l.stderr_merger->flush();
  }
  return r;
}

}  // namespace ddprun::launcher::workers
