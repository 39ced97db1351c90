#include "launcher/agent.hpp"

#include <unistd.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <atomic>
#include <mutex>
#include <optional>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "launcher/node_rendezvous.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/worker_env.hpp"
#include "rendezvous/server.hpp"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::string random_suffix() {
  static const char* chars = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::mt19937 rng(std::random_device{}());
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(chars[rng() % 36]);
  return s;
}

std::string safe_name(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  return s.empty() ? "none" : s;
}

// Where attempt directories go: LOG_DIR/RUN_ID_XXXX, or a temporary directory removed at exit
// when nothing was asked to be kept.
struct RunDirectory {
  fs::path path;
  bool temporary = false;

  explicit RunDirectory(const LaunchOptions& o) {
    std::error_code ec;
    if (!o.log_dir.empty()) {
      path = fs::path(o.log_dir) / (safe_name(o.run_id) + "_" + random_suffix());
    } else {
      path = fs::temp_directory_path(ec) / ("ddprun_" + safe_name(o.run_id) + "_" + random_suffix());
      temporary = !o.redirects.any() && !o.tee.any();
    }
    fs::create_directories(path, ec);
    if (ec) throw ConfigError("cannot create the log directory " + path.string() + ": " + ec.message());
  }
  ~RunDirectory() {
    std::error_code ec;
    if (temporary) fs::remove_all(path, ec);
  }
};

std::vector<std::string> worker_command(const LaunchOptions& o, const Environment& env) {
  std::vector<std::string> argv;
  const bool python_file = o.program.size() > 3 && o.program.substr(o.program.size() - 3) == ".py";
  if (o.module || (python_file && !o.no_python)) {
    auto it = env.find("PYTHON_EXEC");
    argv.push_back(it != env.end() && !it->second.empty() ? it->second : "python3");
    argv.push_back("-u");
    if (o.module) argv.push_back("-m");
  }
  argv.push_back(o.program);
  return argv;
}

std::string store_bind_address(const std::string& master_addr) {
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(master_addr, ec);
  if (!ec && addr.is_loopback()) return master_addr;  // keep a single-node job's store off the network
  return "::";
}

}  // namespace

int run_agent(const LaunchOptions& o) {
  OrphanGuard guard;  // before any socket or thread exists, so it inherits nothing worth keeping
  become_subreaper();

  Environment base = current_environment();
  if (o.nproc_per_node > 1 && base.find("OMP_NUM_THREADS") == base.end()) {
    base["OMP_NUM_THREADS"] = "1";
    log::warn("ddprun") << "OMP_NUM_THREADS is not set: setting it to 1 for each of the " << o.nproc_per_node
                        << " workers to avoid oversubscribing the CPUs; set it yourself to tune";
  }
  const std::string host = host_name();
  RunDirectory run_dir(o);
  std::string signals_text;
  for (int s : o.signals_to_handle) signals_text += (signals_text.empty() ? "" : ",") + signal_name(s);

  const bool dynamic = o.rdzv_backend == "c10d";
  const bool multi_node = o.max_nodes > 1 || dynamic;
  // Multi-node: the address other nodes (and all workers) use for this node.
  const std::string advertise = !o.local_addr.empty() ? o.local_addr : (o.node_rank == 0 ? o.master_addr : host);
  std::unique_ptr<NodeRendezvous> nodes;
  if (multi_node) {
    NodeRendezvousOptions ro;
    ro.run_id = o.run_id;
    ro.dynamic = dynamic;
    ro.min_nodes = o.min_nodes;
    ro.nnodes = o.max_nodes;
    ro.node_rank = dynamic && !o.node_rank_given ? -1 : o.node_rank;
    ro.last_call_timeout = o.last_call_timeout;
    ro.master_addr = o.master_addr;
    ro.master_port = o.master_port.value_or(29500);
    ro.endpoint_host = o.rdzv_endpoint_host;
    ro.endpoint_port = o.rdzv_endpoint_port;
    ro.advertise_addr = advertise;
    ro.host = host;
    ro.join_timeout = o.join_timeout;
    ro.keep_alive_interval = o.keep_alive_interval;
    ro.keep_alive_max_attempt = o.keep_alive_max_attempt;
    nodes = std::make_unique<NodeRendezvous>(ro);
  }

  SupervisorSettings settings;
  settings.handled_signals = o.signals_to_handle;
  settings.shutdown_grace = o.shutdown_timeout;
  settings.host = host;
  settings.node_rank = multi_node ? o.node_rank : -1;
  Supervisor supervisor(settings, &guard);
  std::atomic<int> running_round{-1};
  std::mutex watched_mutex;
  std::optional<RoundEnd> watched_end;  // how the watcher saw the current round end

  std::optional<std::vector<std::string>> gpus;
  if (o.virtual_local_rank) gpus = visible_gpu_ids(base, o.nproc_per_node);

  // Rounds advance on every re-rendezvous; restarts only after failures (membership changes are free).
  int restarts = 0;
  for (int round = dynamic ? nodes->current_round() : 0;; ++round) {
    const int attempt = restarts;
    // A fresh worker store for every round: PyTorch >= 2.6 workers use no per-attempt key prefix.
    // Single node: on --master_addr:--master_port (kernel-picked by default). Several nodes: the
    // group-rank-0 node hosts it on a kernel-picked port and publishes it through the rendezvous.
    std::unique_ptr<rdzv::ServerThread> store;
    auto host_store = [&]() -> uint16_t {
      rdzv::ServerOptions store_options;
      store_options.host = multi_node ? "::" : store_bind_address(o.master_addr);
      store_options.port = multi_node ? 0 : o.master_port.value_or(0);
      store_options.log_lifecycle = false;
      try {
        store = std::make_unique<rdzv::ServerThread>(store_options);
      } catch (const ConnectionError&) {
        if (!multi_node) throw;
        store_options.host = "0.0.0.0";
        store = std::make_unique<rdzv::ServerThread>(store_options);
      }
      return store->port();
    };
    World world;
    if (multi_node) {
      world = nodes->join(round, o.nproc_per_node, host_store);
      round = world.round;  // a node arriving late joins the job's next round
      log::info("ddprun") << "round " << round << " (restart " << attempt << "): node " << world.group_rank << " of "
                          << world.group_world_size << ", ranks " << world.rank_offset << ".."
                          << world.rank_offset + o.nproc_per_node - 1 << " of " << world.world_size
                          << ", MASTER_ADDR=" << world.master_addr << " MASTER_PORT=" << world.master_port;
    } else {
      host_store();
      world.world_size = o.nproc_per_node;
      world.master_addr = o.local_addr.empty() ? o.master_addr : o.local_addr;
      world.master_port = store->port();
      log::info("ddprun") << "attempt " << attempt << ": worker store on " << rdzv::format_endpoint(store->endpoint())
                          << ", MASTER_ADDR=" << world.master_addr << " MASTER_PORT=" << world.master_port;
    }

    AttemptContext ctx;
    ctx.master_addr = world.master_addr;
    ctx.master_port = world.master_port;
    ctx.restart_count = attempt;
    ctx.max_restarts = o.max_restarts;
    ctx.run_id = o.run_id;
    ctx.role = o.role;
    ctx.signals_to_handle = signals_text;
    ctx.one_gpu_each = gpus;

    const fs::path attempt_dir =
        run_dir.path / ("attempt_" + std::to_string(attempt) + (round != attempt ? "_round_" + std::to_string(round) : ""));
    std::vector<WorkerLaunch> launches;
    for (int lr = 0; lr < o.nproc_per_node; ++lr) {
      WorkerPlacement where;
      where.local_rank = lr;
      where.rank = world.rank_offset + lr;
      where.local_world_size = o.nproc_per_node;
      where.world_size = world.world_size;
      where.group_rank = world.group_rank;
      where.group_world_size = world.group_world_size;
      const fs::path rank_dir = attempt_dir / std::to_string(lr);
      std::error_code ec;
      fs::create_directories(rank_dir, ec);
      if (ec) throw ConfigError("cannot create " + rank_dir.string() + ": " + ec.message());
      fs::remove(rank_dir / "error.json", ec);

      WorkerLaunch l;
      l.local_rank = lr;
      l.rank = where.rank;
      l.error_file = (rank_dir / "error.json").string();
      const Environment env = worker_environment(base, where, ctx, l.error_file);
      l.request.argv = worker_command(o, env);
      for (auto& a : substitute_args(o.program_args, lr)) l.request.argv.push_back(std::move(a));
      l.request.envp = to_envp(env);
      l.prefix = expand_prefix(o.log_line_prefix, where.rank, lr, o.role, host);
      const int redirect = o.redirects.for_rank(lr), tee = o.tee.for_rank(lr);
      const bool shown = !o.local_ranks_filter || o.local_ranks_filter->count(lr) != 0;
      l.stdout_to_console = shown && (!(redirect & 1) || (tee & 1));
      l.stderr_to_console = shown && (!(redirect & 2) || (tee & 2));
      if ((redirect | tee) & 1) l.stdout_file = (rank_dir / "stdout.log").string();
      if ((redirect | tee) & 2) l.stderr_file = (rank_dir / "stderr.log").string();
      launches.push_back(std::move(l));
    }
    if (o.redirects.any() || o.tee.any()) log::info("ddprun") << "worker logs in " << attempt_dir.string();

    if (multi_node) {
      running_round = round;
      {
        std::lock_guard lock(watched_mutex);
        watched_end.reset();
      }
      // Another node's failure (or signal, or a membership change) stops this node's workers at once.
      nodes->watch(round, [&supervisor, &running_round, &watched_end, &watched_mutex, round](const RoundEnd& end) {
        {
          std::lock_guard lock(watched_mutex);
          watched_end = end;
        }
        if (end.kind == RoundEnd::Kind::Success) return;
        boost::asio::post(supervisor.io(), [&supervisor, &running_round, round, detail = end.detail] {
          if (running_round == round) supervisor.request_stop(detail);
        });
      });
    }
    GroupResult result;
    try {
      result = supervisor.run(launches);
    } catch (const ProcessError& e) {
      log::error("ddprun") << e.what();
      if (multi_node) {
        WorkerExit failed;
        failed.rank = world.rank_offset;
        failed.host = host;
        failed.exit_code = 127;
        failed.time = std::chrono::system_clock::now();
        failed.error_text = e.what();
        nodes->report_failure(round, failed);
        nodes->leave(round, std::chrono::seconds(30));
      }
      return 1;
    }
    running_round = -1;

    if (!multi_node) {
      switch (result.outcome) {
        case GroupOutcome::Succeeded:
          log::info("ddprun") << "all " << o.nproc_per_node << " worker(s) finished successfully";
          return 0;
        case GroupOutcome::Signalled:
        case GroupOutcome::StoppedByRequest:
          log::warn("ddprun") << "workers stopped by " << signal_name(result.signal ? result.signal : SIGTERM);
          return 128 + (result.signal ? result.signal : SIGTERM);
        case GroupOutcome::Failed:
          break;
      }
      const WorkerExit& root = result.failures.front();
      if (restarts < o.max_restarts && !supervisor.stop_signal_received()) {
        ++restarts;
        log::warn("ddprun") << "rank " << root.rank << " failed with " << describe_exit(root)
                            << "; restarting the worker group (restart " << restarts << " of " << o.max_restarts
                            << ")";
        continue;
      }
      std::cerr << format_failure_report(o.program, result.failures, result.stopped_ranks) << std::flush;
      if (o.max_restarts > 0) log::error("ddprun") << "giving up after " << o.max_restarts << " restart(s)";
      return shell_exit_code(root);
    }

    // Multi-node: agree on how the round ended.
    RoundEnd end;
    switch (result.outcome) {
      case GroupOutcome::Succeeded: end = nodes->report_success(round, world.group_world_size); break;
      case GroupOutcome::Failed: end = nodes->report_failure(round, result.failures.front()); break;
      case GroupOutcome::Signalled: end = nodes->report_signal(round, result.signal); break;
      case GroupOutcome::StoppedByRequest: {
        // Stopped because the watcher saw the round end: use what it saw.
        std::optional<RoundEnd> seen;
        {
          std::lock_guard lock(watched_mutex);
          seen = watched_end;
        }
        end = seen ? *seen : nodes->wait_end(round);
        break;
      }
    }
    switch (end.kind) {
      case RoundEnd::Kind::Success:
        nodes->leave(round, std::chrono::seconds(30));
        log::info("ddprun") << "all " << world.world_size << " worker(s) on " << world.group_world_size
                            << " nodes finished successfully";
        return 0;
      case RoundEnd::Kind::Signal:
        nodes->leave(round, std::chrono::seconds(30));
        log::warn("ddprun") << "job stopped by " << end.detail;
        return 128 + (result.signal ? result.signal : SIGTERM);
      case RoundEnd::Kind::StoreLost:
        log::error("ddprun") << end.detail;
        return 1;
      case RoundEnd::Kind::NodeLost:
        if (dynamic && !supervisor.stop_signal_received()) {
          // Elastic: the survivors go on without it if at least MIN of them rendezvous again.
          log::warn("ddprun") << end.detail << "; re-rendezvous without it (not counted as a restart)";
          continue;
        }
        // Static membership: the job cannot go on without that node (and it would never reach
        // the end-of-job barrier).
        log::error("ddprun") << "job stopped: " << end.detail;
        return 1;
      case RoundEnd::Kind::Membership:
        log::info("ddprun") << end.detail << ": re-rendezvous to admit it (not counted as a restart)";
        continue;
      case RoundEnd::Kind::Failure:
        break;
    }
    if (restarts < o.max_restarts && !supervisor.stop_signal_received()) {
      ++restarts;
      log::warn("ddprun") << end.detail << "; restarting the worker groups of all " << world.group_world_size
                          << " nodes (restart " << restarts << " of " << o.max_restarts << ")";
      continue;
    }
    std::vector<WorkerExit> failures;
    if (end.root_cause) failures.push_back(*end.root_cause);
    for (const auto& f : result.failures) {
      if (!end.root_cause || f.rank != end.root_cause->rank) failures.push_back(f);
    }
    std::cerr << format_failure_report(o.program, failures, result.stopped_ranks) << std::flush;
    if (o.max_restarts > 0) log::error("ddprun") << "giving up after " << o.max_restarts << " restart(s)";
    nodes->leave(round, std::chrono::seconds(30));
    return end.root_cause ? shell_exit_code(*end.root_cause) : 1;
  }
}

}  // namespace ddprun::launcher
