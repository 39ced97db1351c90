// The agent's set-up for each round (see agent_state.hpp): the rendezvous backend, the worker
// store, the attempt directories, the watchdog and the workers' launches (run_directory.cpp has
// the run directory).
#include <netdb.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <iomanip>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/agent/agent_state.hpp"
#include "launcher/rendezvous/etcd/etcd_rendezvous.hpp"
#include "launcher/rendezvous/local_rendezvous.hpp"
#include "launcher/workers/python_hook.hpp"
#include "launcher/watchdog/stacks.hpp"
#include "launcher/rendezvous/store/store_rendezvous.hpp"

namespace ddprun::launcher::agent {

using cli::is_multi_node;
using cli::LaunchOptions;
using cli::LocalRankArg;
using cli::RdzvBackend;
using rendezvous::LocalRendezvous;
using rendezvous::RendezvousBackend;
using rendezvous::World;
using rendezvous::etcd::EtcdRendezvous;
using rendezvous::etcd::EtcdRendezvousOptions;
using rendezvous::store::StoreRendezvous;
using rendezvous::store::StoreRendezvousOptions;
using watchdog::stack_signal;
using watchdog::Watchdog;
using watchdog::WatchdogSettings;
using watchdog::WatchedRank;
using workers::allowed_cpus;
using workers::AttemptContext;
using workers::become_subreaper;
using workers::current_environment;
using workers::Environment;
using workers::expand_prefix;
using workers::format_cpu_list;
using workers::GpuMaker;
using workers::is_stop_signal;
using workers::numa_binding_name;
using workers::NumaBinding;
using workers::place_ranks;
using workers::RankPlacement;
using workers::read_topology;
using workers::SignalWatcher;
using workers::spawn_process;
using workers::SpawnedProcess;
using workers::SpawnRequest;
using workers::substitute_args;
using workers::SupervisorSettings;
using workers::to_envp;
using workers::Topology;
using workers::visible_gpu_ids;
using workers::visible_gpus_of;
using workers::worker_environment;
using workers::WorkerLaunch;
using workers::WorkerPlacement;
using workers::write_python_hook;
using workers::Zygote;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::vector<std::string> worker_command(const LaunchOptions& o, const Environment& env) {
  std::vector<std::string> argv;
  const bool python_file = o.run_path || (o.program.size() > 3 && o.program.substr(o.program.size() - 3) == ".py");
  if (o.module || (python_file && !o.no_python)) {
    auto it = env.find("PYTHON_EXEC");
    argv.push_back(it != env.end() && !it->second.empty() ? it->second : "python3");
    argv.push_back("-u");
    if (o.module) argv.push_back("-m");
  }
  argv.push_back(o.program);
  return argv;
}

std::vector<std::string> resolve_all(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (name.empty()) continue;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) {
      log::warn("ddprun") << "cannot resolve node address '" << name
                          << "': its workers may be refused by the worker store";
      continue;
    }
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      char text[NI_MAXHOST];
      if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) {
        out.emplace_back(text);
      }
    }
    ::freeaddrinfo(res);
  }
  return out;
}

Agent::Agent(const LaunchOptions& o, JobReport& report)
    : o_(o),
      report_(report),
      multi_node_(is_multi_node(o)),
      base_env_(current_environment()),
      host_(host_name()),
      run_dir_(o),
      supervisor_(
          SupervisorSettings{o.shutdown_timeout, host_name(), multi_node_ ? o.node_rank : -1, 12, o.progress_interval},
          &guard_),
      file_timer_(o.file_timer),
      capture_stacks_(o.hang_timeout.count() > 0 || file_timer_) {
  become_subreaper();
  if (o.health_check_port) {
    try {
      health_ = std::make_unique<HealthEndpoint>(*o.health_check_port);
    } catch (const ConnectionError& e) {
      throw ConfigError("TORCHELASTIC_HEALTH_CHECK_PORT=" + std::to_string(*o.health_check_port) +
                        ": cannot serve the health endpoint: " + e.what() + " (choose a free port)");
    }
    log::info("ddprun") << "health endpoint on port " << health_->port() << " (TORCHELASTIC_HEALTH_CHECK_PORT)";
  }
  if (file_timer_) {
    // As torchrun: the user's TORCHELASTIC_TIMER_FILE, else one of ddprun's (private) own.
    timer_file_ = !o.timer_file.empty() ? o.timer_file : (run_dir_.path / "torchelastic_timer").string();
  }
  // Every worker gets the Python hook (python_hook.hpp): whether it runs Python is not known here
  // (a shell script or a binary may start it), and it does nothing a worker has not asked for.
  python_hook_dir_ = (run_dir_.path / "python").string();
  try {
    create_private_directory(python_hook_dir_);
    write_python_hook(python_hook_dir_);
  } catch (const Error& e) {
    // A full disk, say: the workers start without the hook, and a PyTorch that needs it says what
    // to do (python_hook.hpp).
    log::warn("ddprun") << e.what() << "; workers start without ddprun's Python hook";
    python_hook_dir_.clear();
  }
  plan_numa_binding();
  if (placements_.empty() && o.nproc_per_node > 1 && base_env_.find("OMP_NUM_THREADS") == base_env_.end()) {
    base_env_["OMP_NUM_THREADS"] = "1";
    log::warn("ddprun") << "OMP_NUM_THREADS is not set: setting it to 1 for each of the " << o.nproc_per_node
                        << " workers to avoid oversubscribing the CPUs; set it yourself to tune";
  }
  for (int s : o.signals_to_handle) signals_text_ += (signals_text_.empty() ? "" : ",") + signal_name(s);
  if (o.virtual_local_rank) {
    if (o.gpu_vendor != cli::GpuVendor::None) gpu_variable_ = cli::gpu_visibility_variable(o.gpu_vendor);
    gpus_ = visible_gpu_ids(base_env_, o.nproc_per_node, gpu_variable_);
  }
  start_zygote();
  signals_ = std::make_unique<SignalWatcher>(o.signals_to_handle, [this](int s) { on_signal(s); });
}

void Agent::start_zygote() {
  if (o_.preload.empty()) return;
  const std::vector<std::string> command = worker_command(o_, base_env_);
  if (command.size() < 2 || command[1] != "-u") {
    log::info("ddprun") << "--preload applies to Python programs (PROGRAM.py, -m MODULE): " << o_.program
                        << " is started as it is";
    return;
  }
  Environment env = base_env_;
  if (!python_hook_dir_.empty()) {
    auto pp = env.find("PYTHONPATH");
    env["PYTHONPATH"] = python_hook_dir_ + (pp != env.end() && !pp->second.empty() ? ":" + pp->second : "");
  }
  try {
    zygote_ = std::make_unique<Zygote>(command[0], o_.preload, to_envp(env), (run_dir_.path / "zygote.sock").string(),
                                       &guard_);
  } catch (const Error& e) {
    log::warn("ddprun") << "--preload: " << e.what() << "; workers start the normal way";
    return;
  }
  supervisor_.set_spawner([this](const SpawnRequest& r) { return spawn_worker(r); });
}

SpawnedProcess Agent::spawn_worker(const SpawnRequest& request) {
  if (zygote_ && !zygote_->ready(std::chrono::minutes(5))) {
    log::warn("ddprun") << "--preload: " << zygote_->why() << "; workers start the normal way";
    zygote_.reset();
  }
  if (zygote_) {
    if (!zygote_announced_) {
      std::string modules;
      for (const std::string& m : o_.preload) modules += (modules.empty() ? "" : ",") + m;
      log::info("ddprun") << "--preload: " << modules << " imported once in " << std::fixed << std::setprecision(2)
                          << zygote_->import_seconds() << " s (zygote pid " << zygote_->pid()
                          << "); workers are forked from it";
      zygote_announced_ = true;
    }
    try {
      return zygote_->spawn(request);
    } catch (const ProcessError& e) {
      log::warn("ddprun") << "--preload: " << e.what() << "; workers start the normal way from now on";
      zygote_.reset();
    }
  }
  return spawn_process(request);
}

void Agent::plan_numa_binding() {
  if (o_.numa_binding == NumaBinding::Off) return;
  // The GPUs of the vendor the ranks use (NVIDIA's unless the job counted AMD's or Intel's).
  const GpuMaker maker = o_.gpu_vendor == cli::GpuVendor::Amd     ? GpuMaker::Amd
                         : o_.gpu_vendor == cli::GpuVendor::Intel ? GpuMaker::Intel
                                                                  : GpuMaker::Nvidia;
  const Topology topology = read_topology(o_.topology_root, allowed_cpus(), maker);
  const auto env = [this](const std::string& name) -> std::optional<std::string> {
    if (auto it = base_env_.find(name); it != base_env_.end()) return it->second;
    return std::nullopt;
  };
  std::string why;
  const auto gpus = visible_gpus_of(topology, maker, env, &why);
  if (!gpus) log::warn("ddprun") << "--numa_binding: " << why << "; the workers are placed as CPU workers";
  placements_ = place_ranks(topology, o_.numa_binding, o_.nproc_per_node, gpus.value_or(std::vector<int>{}));
  omp_threads_per_rank_ = base_env_.find("OMP_NUM_THREADS") == base_env_.end();
  const std::string mode = numa_binding_name(o_.numa_binding);
  for (size_t lr = 0; lr < placements_.size(); ++lr) {
    const RankPlacement& p = placements_[lr];
    log::info("ddprun") << "--numa_binding " << mode << ": local rank " << lr << " on CPUs " << format_cpu_list(p.cpus)
                        << ", memory of NUMA node " << p.numa_node << (p.near.empty() ? "" : ", near " + p.near)
                        << (omp_threads_per_rank_ ? ", OMP_NUM_THREADS=" + std::to_string(p.threads) : "");
  }
}

Agent::~Agent() {
  if (backend_ && watching_) backend_->unwatch();
  signals_.reset();
}

void Agent::on_signal(int signo) {
  // On the signal thread: wake whatever the agent waits on, and tell the workers' supervisor.
  if (is_stop_signal(signo)) stop_.request(signo);
  supervisor_.deliver_signal(signo);
}

std::optional<rdzv::Token> Agent::read_token() const {
  if (o_.token_file.empty()) return std::nullopt;
  return rdzv::read_token_file(o_.token_file);
}

void Agent::arm_fence(std::chrono::milliseconds lost_after) {
  // The other nodes count this node as lost after `lost_after` without a heartbeat (an expired
  // lease); its workers are stopped a quarter earlier, so that they never run beside a group
  // re-formed without them. At least a second: a busy machine's scheduling hiccups are no reason.
  fence_window_ = std::max<std::chrono::milliseconds>(lost_after * 3 / 4, std::chrono::seconds(1));
  guard_.arm_fence(fence_window_);
}

void Agent::confirm_membership() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t now = static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
  membership_until_ns_.store(now + static_cast<uint64_t>(fence_window_.count()) * 1'000'000ULL,
                             std::memory_order_release);
}

std::unique_ptr<RendezvousBackend> Agent::make_backend() {
  // The address other nodes (and the workers) use for this node: --local_addr; else node 0 of a
  // static job is --master_addr, and any other node is known by its fully qualified name, as
  // torchrun's (a Kubernetes pod with a subdomain is reachable by that name only).
  const bool static_node_zero = o_.rdzv_backend == RdzvBackend::Static && o_.node_rank == 0;
  std::string fqdn = fully_qualified_host_name();
  if (fqdn.empty()) fqdn = host_;
  advertise_addr_ = !o_.local_addr.empty() ? o_.local_addr : (!multi_node_ || static_node_zero ? o_.master_addr : fqdn);
  if (!multi_node_) return std::make_unique<LocalRendezvous>(advertise_addr_);
  if (o_.rdzv_backend == RdzvBackend::Etcd) {
    EtcdRendezvousOptions eo;
    eo.run_id = o_.run_id;
    eo.min_nodes = o_.min_nodes;
    eo.nnodes = o_.max_nodes;
    eo.node_rank_hint = o_.node_rank_given ? o_.node_rank : -1;
    eo.last_call_timeout = o_.last_call_timeout;
    eo.join_timeout = o_.join_timeout;
    eo.advertise_addr = advertise_addr_;
    eo.host = host_;
    eo.etcd.endpoints = o_.etcd.endpoints;
    eo.etcd.user = o_.etcd.user;
    if (!o_.etcd.password_file.empty())
      eo.etcd.password = rdzv::read_private_file(o_.etcd.password_file, "etcd password file");
    eo.etcd.ca_file = o_.etcd.ca_file;
    eo.etcd.cert_file = o_.etcd.cert_file;
    eo.etcd.key_file = o_.etcd.key_file;
    eo.prefix = o_.etcd.prefix;
    eo.lease_ttl = o_.etcd.lease_ttl;
    eo.progress_interval = o_.progress_interval;
    return std::make_unique<EtcdRendezvous>(eo, stop_);
  }
  StoreRendezvousOptions ro;
  ro.run_id = o_.run_id;
  ro.dynamic = o_.rdzv_backend == RdzvBackend::C10d;
  ro.min_nodes = o_.min_nodes;
  ro.nnodes = o_.max_nodes;
  ro.node_rank = ro.dynamic && !o_.node_rank_given ? -1 : o_.node_rank;
  ro.last_call_timeout = o_.last_call_timeout;
  ro.master_addr = o_.master_addr;
  ro.master_port = o_.master_port.value_or(29500);
  ro.endpoint_host = o_.rdzv_endpoint_host;
  ro.endpoint_port = o_.rdzv_endpoint_port;
  ro.is_host = o_.rdzv_is_host;
  ro.read_timeout = o_.rdzv_read_timeout;
  ro.store_reconnect_timeout = o_.store_reconnect_timeout;
  ro.advertise_addr = advertise_addr_;
  ro.host = host_;
  ro.token = read_token();
  ro.token_file = o_.token_file;
  ro.join_timeout = o_.join_timeout;
  if (ro.dynamic && o_.min_nodes < o_.max_nodes) {
    // Elastic: the others re-form without a node they count as lost, so its workers must stop
    // first. (A static job ends when a node is lost: no second group forms.)
    ro.alive = [this] {
      guard_.renew();
      confirm_membership();
    };
    arm_fence(o_.keep_alive_interval * o_.keep_alive_max_attempt);
  }
  ro.keep_alive_interval = o_.keep_alive_interval;
  ro.keep_alive_max_attempt = o_.keep_alive_max_attempt;
  ro.progress_interval = o_.progress_interval;
  return std::make_unique<StoreRendezvous>(ro, stop_);
}

uint16_t Agent::host_worker_store() {
  // A fresh worker store for every round: PyTorch >= 2.6 workers use no per-attempt key prefix.
  // Single node: on --master_addr:--master_port (kernel-picked by default). Several nodes: the
  // group-rank-0 node hosts it on a kernel-picked port and publishes it through the rendezvous.
  // Real PyTorch workers cannot prove a secret, so the store is bound to the address the workers
  // use (not "::") and admits only this node (loopback and that address) until the rendezvous
  // names the other nodes (Agent::rendezvous).
  worker_store_.reset();
  rdzv::ServerOptions so;
  so.host = advertise_addr_;
  so.port = multi_node_ ? 0 : o_.master_port.value_or(0);
  so.log_lifecycle = false;
  so.allowed_peers = resolve_all({advertise_addr_});
  try {
    worker_store_ = std::make_unique<rdzv::ServerThread>(so);
  } catch (const ConnectionError& e) {
    if (!multi_node_ && o_.master_port) throw;  // the user's --master_port: no other port will do
    // The workers' address is not one this host can bind (behind NAT, say): listen on every
    // address, with the allow list still in force.
    log::warn("ddprun") << "worker store: " << e.what() << "; listening on every address instead";
    so.host = "::";
    try {
      worker_store_ = std::make_unique<rdzv::ServerThread>(so);
    } catch (const ConnectionError&) {
      so.host = "0.0.0.0";  // no IPv6 on this host
      worker_store_ = std::make_unique<rdzv::ServerThread>(so);
    }
  }
  return worker_store_->port();
}

fs::path Agent::attempt_directory(const World& world) const {
  return run_dir_.path / ("attempt_" + std::to_string(restarts_) +
                          (world.round != restarts_ ? "_round_" + std::to_string(world.round) : ""));
}

std::unique_ptr<Watchdog> Agent::make_watchdog(const World& world, const fs::path& attempt_dir) {
  WatchdogSettings ws;
  ws.hang_timeout = o_.hang_timeout;
  ws.straggler_factor = o_.straggler_factor;
  ws.python_stacks = capture_stacks_;
  ws.file_timer = file_timer_;
  ws.timer_file = timer_file_;
  ws.program = o_.program;
  for (const auto& a : o_.program_args) ws.program += " " + a;
  if (ws.program.size() > 120) ws.program = ws.program.substr(0, 117) + "...";
  ws.host = host_;
  ws.node = multi_node_ ? world.group_rank : -1;
  ws.attempt_dir = attempt_dir.string();
  ws.worker_store_port = static_cast<uint16_t>(world.master_port);
  if (fence_window_.count() > 0) {
    confirm_membership();  // the rendezvous has just taken this node into the round
    ws.membership_until_ns = &membership_until_ns_;
  }
  ws.rates_period = o_.step_rates_period;
  std::vector<WatchedRank> ranks;
  create_private_directory(attempt_dir);
  for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
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
  ctx.max_restarts = o_.max_restarts;
  ctx.run_id = o_.run_id;
  ctx.role = o_.role;
  ctx.signals_to_handle = signals_text_;
  ctx.one_gpu_each = gpus_;
  ctx.gpu_variable = gpu_variable_;
  std::vector<WorkerLaunch> launches;
  // One file per stream for every rank of the attempt, as torchrun writes them.
  std::shared_ptr<FilteredCopy> stdout_filtered, stderr_filtered;
  if (!o_.duplicate_stdout_filters.empty()) {
    stdout_filtered =
        std::make_shared<FilteredCopy>(o_.duplicate_stdout_filters, (attempt_dir / "filtered_stdout.log").string());
  }
  if (!o_.duplicate_stderr_filters.empty()) {
    stderr_filtered =
        std::make_shared<FilteredCopy>(o_.duplicate_stderr_filters, (attempt_dir / "filtered_stderr.log").string());
  }
  // --merge_lines: one merger per console stream for the group (it prints what waits when the
  // group ends and the last launch holding it goes).
  std::shared_ptr<LineMerger> stdout_merger, stderr_merger;
  if (o_.merge_lines.count() > 0 && o_.nproc_per_node > 1) {
    const workers::Consoles& c = workers::consoles();
    if (c.out) stdout_merger = std::make_shared<LineMerger>(c.out, o_.merge_lines, o_.log_line_prefix, o_.role, host_);
    if (c.err) stderr_merger = std::make_shared<LineMerger>(c.err, o_.merge_lines, o_.log_line_prefix, o_.role, host_);
  }
  for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
    WorkerPlacement where;
    where.local_rank = lr;
    where.rank = world.rank_offset + lr;
    where.local_world_size = o_.nproc_per_node;
    where.world_size = world.world_size;
    where.group_rank = world.group_rank;
    where.group_world_size = world.group_world_size;
    const fs::path rank_dir = attempt_dir / std::to_string(lr);
    std::error_code ec;
    fs::remove(rank_dir / "error.json", ec);

    WorkerLaunch l;
    l.local_rank = lr;
    l.rank = where.rank;
    l.error_file = (rank_dir / "error.json").string();
    Environment env = worker_environment(base_env_, where, ctx, l.error_file);
    // The watchdog's side of the contract (see watchdog.hpp and stacks.hpp).
    if (std::string page = watchdog.progress_file(lr); !page.empty()) env["DDPRUN_PROGRESS_FILE"] = std::move(page);
    if (capture_stacks_) {
      env["DDPRUN_STACK_DIR"] = rank_dir.string();
      env["DDPRUN_STACK_SIGNAL"] = std::to_string(stack_signal());
    }
    if (!python_hook_dir_.empty()) {
      auto pp = env.find("PYTHONPATH");
      env["PYTHONPATH"] = python_hook_dir_ + (pp != env.end() && !pp->second.empty() ? ":" + pp->second : "");
    }
    if (file_timer_) env["TORCHELASTIC_TIMER_FILE"] = timer_file_;
    if (!placements_.empty()) {
      const RankPlacement& p = placements_[static_cast<size_t>(lr)];
      l.request.cpus = p.cpus;
      l.request.preferred_numa_node = p.numa_node;
      if (omp_threads_per_rank_) env["OMP_NUM_THREADS"] = std::to_string(p.threads);
    }
    l.request.argv = worker_command(o_, env);
    // torch.distributed.launch's convention: right after the script, before its own arguments.
    if (o_.local_rank_arg != LocalRankArg::None) {
      l.request.argv.push_back((o_.local_rank_arg == LocalRankArg::Dash ? "--local-rank=" : "--local_rank=") +
                               env["LOCAL_RANK"]);
    }
    for (auto& a : substitute_args(o_.program_args, lr)) l.request.argv.push_back(std::move(a));
    l.request.envp = to_envp(env);
    l.prefix = expand_prefix(o_.log_line_prefix, where.rank, lr, o_.role, host_);
    const int redirect = o_.redirects.for_rank(lr), tee = o_.tee.for_rank(lr);
    const bool shown = !o_.local_ranks_filter || o_.local_ranks_filter->count(lr) != 0;
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
  if (o_.redirects.any() || o_.tee.any() || stdout_filtered || stderr_filtered) {
    log::info("ddprun") << "worker logs in " << attempt_dir.string();
  }
  return launches;
}

}  // namespace ddprun::launcher::agent
