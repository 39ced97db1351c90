// Each round's workers (see agent.hpp): the attempt directory, the watchdog over the ranks,
// and every worker's launch (command, environment, placement, log files).
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/agent/agent.hpp"
#include "launcher/watchdog/stacks.hpp"
#include "ddprun/worker/env_contract.hpp"

namespace ddprun::launcher::agent {

namespace names = worker::env_names;

using cli::LocalRankArg;
using rendezvous::World;
using watchdog::stack_signal;
using watchdog::Watchdog;
using watchdog::WatchdogSettings;
using watchdog::WatchedRank;
using workers::AttemptContext;
using workers::Environment;
using workers::expand_prefix;
using workers::RankPlacement;
using workers::substitute_args;
using workers::to_envp;
using workers::worker_environment;
using workers::WorkerExit;
using workers::WorkerLaunch;
using workers::WorkerPlacement;

fs::path Agent::attempt_directory(const World& world) const {
  return run_dir_.path / ("attempt_" + std::to_string(restarts_) +
                          (world.round != restarts_ ? "_round_" + std::to_string(world.round) : ""));
}

void Agent::view_event(const char* kind, std::string text) {
  if (trace_) trace_->event(kind, text);
  if (!health_) return;
  health_->view().event(kind, std::move(text));
  health_->view().set_report(report_.to_json());
}

void Agent::view_round(const World& world) {
  if (trace_ && multi_node_) trace_->set_node(world.group_rank);
  if (!health_ && !trace_) return;
  if (health_) {
    view::JobView& v = health_->view();
    v.set_identity(options_.run_id, host_, multi_node_ ? world.group_rank : -1, world.group_world_size);
    v.new_round(world.round, world.world_size, restarts_);
  }
  std::string text = "round " + std::to_string(world.round) + ": " + std::to_string(world.world_size) + " rank(s)";
  if (multi_node_) {
    text += " on " + std::to_string(world.group_world_size) + " nodes, this node " + std::to_string(world.group_rank);
    if (view_nodes_ > 0 && view_nodes_ != world.group_world_size) {
      text += " (" + std::string(world.group_world_size > view_nodes_ ? "up" : "down") + " from " +
              std::to_string(view_nodes_) + " nodes)";
    }
  }
  view_nodes_ = world.group_world_size;
  view_event("start", std::move(text));
}

void Agent::view_stopping(const GroupResult& so_far) {
  if (!health_) return;
  switch (so_far.outcome) {
    case workers::GroupOutcome::Failed: {
      if (so_far.failures.empty()) return;
      const WorkerExit& first = so_far.failures.front();
      const std::string why = "rank " + std::to_string(first.rank) + " failed with " + workers::describe_exit(first);
      // The report first: whoever reads the phase reads a root cause with it.
      report_.group_failing(so_far.failures);
      view_event("failure", why);
      health(StatusServer::Phase::Stopping, why + ": stopping the other workers");
      return;
    }
    case workers::GroupOutcome::Signalled:
      health(StatusServer::Phase::Stopping,
             "received " + signal_name(supervisor_.stop_signal()) + ": stopping the workers");
      return;
    case workers::GroupOutcome::StoppedByRequest:  // another node's end, a hang (whose phase stands)
      health(StatusServer::Phase::Stopping, so_far.stop_reason + ": stopping this node's workers");
      return;
    case workers::GroupOutcome::Succeeded: return;
  }
}

std::unique_ptr<Watchdog> Agent::make_watchdog(const World& world, const fs::path& attempt_dir) {
  WatchdogSettings ws;
  ws.hang_timeout = options_.hang_timeout;
  ws.straggler_factor = options_.straggler_factor;
  ws.python_stacks = capture_stacks_;
  ws.file_timer = file_timer_;
  ws.timer_file = timer_file_;
  ws.program = command_line(120);
  ws.host = host_;
  ws.node = multi_node_ ? world.group_rank : -1;
  ws.world_size = world.world_size;
  ws.attempt_dir = attempt_dir.string();
  ws.worker_store_port = static_cast<uint16_t>(world.master_port);
  if (fence_window_.count() > 0) {
    confirm_membership();  // the rendezvous has just taken this node into the round
    ws.membership_until_ns = &membership_until_ns_;
  }
  ws.rates_period = options_.step_rates_period;
  if (health_ || trace_) {
    ws.on_tick = [view = health_ ? &health_->view() : nullptr, trace = trace_.get()](
                     std::chrono::steady_clock::time_point now, const std::vector<watchdog::RankReading>& ranks) {
      if (view) view->update(now, ranks);
      if (trace) trace->update(now, ranks);
    };
  }
  std::vector<WatchedRank> ranks;
  create_private_directory(attempt_dir);
  for (int lr = 0; lr < options_.nproc_per_node; ++lr) {
    const fs::path dir = attempt_dir / std::to_string(lr);
    create_private_directory(dir);
    ranks.push_back({world.rank_offset + lr, lr, dir.string()});
  }
  return std::make_unique<Watchdog>(ws, ranks);
}

std::vector<WorkerLaunch> Agent::make_launches(const World& world, const fs::path& attempt_dir,
                                               const Watchdog& watchdog) {
  AttemptContext ctx;
  ctx.master_addr = world.master_addr;
  ctx.master_port = world.master_port;
  ctx.restart_count = restarts_;
  ctx.round = world.round;
  ctx.max_restarts = options_.max_restarts;
  ctx.run_id = options_.run_id;
  ctx.role = options_.role;
  ctx.signals_to_handle = signals_text_;
  ctx.one_gpu_each = gpus_;
  ctx.gpu_variable = gpu_variable_;
  std::vector<WorkerLaunch> launches;
  // One file per stream for every rank of the attempt, as torchrun writes them.
  std::shared_ptr<FilteredCopy> stdout_filtered, stderr_filtered;
  if (!options_.duplicate_stdout_filters.empty()) {
    stdout_filtered = std::make_shared<FilteredCopy>(options_.duplicate_stdout_filters,
                                                     (attempt_dir / "filtered_stdout.log").string());
  }
  if (!options_.duplicate_stderr_filters.empty()) {
    stderr_filtered = std::make_shared<FilteredCopy>(options_.duplicate_stderr_filters,
                                                     (attempt_dir / "filtered_stderr.log").string());
  }
  // --merge_lines: one merger per console stream for the group (it prints what waits when the
  // group ends and the last launch holding it goes).
  std::shared_ptr<LineMerger> stdout_merger, stderr_merger;
  if (options_.merge_lines.count() > 0 && options_.nproc_per_node > 1) {
    const workers::Consoles& c = workers::consoles();
    if (c.out)
      stdout_merger =
          std::make_shared<LineMerger>(c.out, options_.merge_lines, options_.log_line_prefix, options_.role, host_);
    if (c.err)
      stderr_merger =
          std::make_shared<LineMerger>(c.err, options_.merge_lines, options_.log_line_prefix, options_.role, host_);
  }
  for (int lr = 0; lr < options_.nproc_per_node; ++lr) {
    WorkerPlacement where;
    where.local_rank = lr;
    where.rank = world.rank_offset + lr;
    where.local_world_size = options_.nproc_per_node;
    where.world_size = world.world_size;
    where.group_rank = world.group_rank;
    where.group_world_size = world.group_world_size;
    where.role_rank = world.role_rank_offset + lr;
    where.role_world_size = world.role_world_size;
    const fs::path rank_dir = attempt_dir / std::to_string(lr);
    std::error_code ec;
    fs::remove(rank_dir / "error.json", ec);

    WorkerLaunch l;
    l.local_rank = lr;
    l.rank = where.rank;
    l.error_file = (rank_dir / "error.json").string();
    Environment env = worker_environment(base_env_, where, ctx, l.error_file);
    // The watchdog's side of the contract (see watchdog.hpp and stacks.hpp).
    if (std::string page = watchdog.progress_file(lr); !page.empty()) env[names::kProgressFile] = std::move(page);
    env[names::kExcludeNodeFile] = exclusion_file().string();
    // A replica group's round key (common/ft_wire.hpp): in the environment only, never in the store.
    if (!world.worker_key.empty()) env["DDPRUN_FT_KEY"] = world.worker_key;
    if (capture_stacks_) {
      env[names::kStackDir] = rank_dir.string();
      env[names::kStackSignal] = std::to_string(stack_signal());
    }
    if (!python_hook_dir_.empty()) {
      auto pp = env.find("PYTHONPATH");
      env["PYTHONPATH"] = python_hook_dir_ + (pp != env.end() && !pp->second.empty() ? ":" + pp->second : "");
    }
    if (file_timer_) env[names::kTimerFile] = timer_file_;
    if (!placements_.empty()) {
      const RankPlacement& p = placements_[static_cast<size_t>(lr)];
      l.request.cpus = p.cpus;
      l.request.preferred_numa_node = p.numa_node;
      if (omp_threads_per_rank_) env["OMP_NUM_THREADS"] = std::to_string(p.threads);
    }
    l.request.argv = worker_command(options_, env);
    // torch.distributed.launch's convention: right after the script, before its own arguments.
    if (options_.local_rank_arg != LocalRankArg::None) {
      l.request.argv.push_back((options_.local_rank_arg == LocalRankArg::Dash ? "--local-rank=" : "--local_rank=") +
                               env[names::kLocalRank]);
    }
    for (auto& a : substitute_args(options_.program_args, lr)) l.request.argv.push_back(std::move(a));
    l.request.envp = to_envp(env);
    l.prefix = expand_prefix(options_.log_line_prefix, where.rank, lr, options_.role, host_);
    const int redirect = options_.redirects.for_rank(lr), tee = options_.tee.for_rank(lr);
    const bool shown = !options_.local_ranks_filter || options_.local_ranks_filter->count(lr) != 0;
    l.stdout_to_console = shown && (!(redirect & 1) || (tee & 1));
    l.stderr_to_console = shown && (!(redirect & 2) || (tee & 2));
    if ((redirect | tee) & 1) l.stdout_file = (rank_dir / "stdout.log").string();
    if ((redirect | tee) & 2) l.stderr_file = (rank_dir / "stderr.log").string();
    l.stdout_filtered = stdout_filtered;
    l.stderr_filtered = stderr_filtered;
    l.stdout_merger = stdout_merger;
    l.stderr_merger = stderr_merger;
    launches.push_back(std::move(l));
  }
  if (options_.redirects.any() || options_.tee.any() || stdout_filtered || stderr_filtered) {
    log::info("ddprun") << "worker logs in " << attempt_dir.string();
  }
  return launches;
}

}  // namespace ddprun::launcher::agent
