// The agent's own set-up (see agent.hpp): the signals, the health endpoint, the Python hook,
// the --preload zygote and the NUMA placement; agent_rendezvous.cpp has how it meets the other
// nodes, agent_launches.cpp each round's workers and watchdog, run_directory.cpp the run directory.
#include <unistd.h>

#include <iomanip>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/agent/agent.hpp"
#include "launcher/workers/python_hook.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::launcher::agent {

using cli::is_multi_node;
using cli::LaunchOptions;
using workers::allowed_cpus;
using workers::become_subreaper;
using workers::current_environment;
using workers::Environment;
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
using workers::SupervisorSettings;
using workers::to_envp;
using workers::Topology;
using workers::visible_gpu_ids;
using workers::visible_gpus_of;
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

std::string Agent::command_line(size_t most) const {
  std::string line = options_.program;
  for (const auto& a : options_.program_args) line += " " + a;
  if (line.size() > most) line = line.substr(0, most - 3) + "...";
  return line;
}

Agent::Agent(const LaunchOptions& o, JobReport& report)
    : options_(o),
      report_(report),
      multi_node_(is_multi_node(o)),
      base_env_(current_environment()),
      host_(host_name()),
      run_dir_(o),
      supervisor_(SupervisorSettings{.shutdown_grace = o.shutdown_timeout,
                                     .host = host_name(),
                                     .node_rank = multi_node_ ? o.node_rank : -1,
                                     .progress_interval = o.progress_interval,
                                     .kill_wait = o.kill_timeout},
                  &guard_),
      file_timer_(o.file_timer),
      capture_stacks_(o.hang_timeout.count() > 0 || file_timer_) {
  become_subreaper();
  if (o.replica_group) {
    // The workers' side of the quorum (docs/fault-tolerance.md): which group they are, and that
    // their agent relays quorum requests through the worker store.
    base_env_["DDPRUN_REPLICA_GROUP"] = std::to_string(*o.replica_group);
    base_env_["DDPRUN_MIN_REPLICA_GROUPS"] = std::to_string(o.min_replica_groups);
    base_env_["DDPRUN_FT_RUN_ID"] = o.run_id;
  }
  if (o.http_port) {
    const std::string given =
        o.http_port_from + (o.http_port_from.rfind("--", 0) == 0 ? " " : "=") + std::to_string(*o.http_port);
    view::ViewSettings vs;
    vs.straggler_factor = o.straggler_factor;
    try {
      health_ = std::make_unique<StatusServer>(*o.http_port, vs, o.http_allowed_hosts);
    } catch (const ConnectionError& e) {
      throw ConfigError(given + ": cannot serve the job's HTTP endpoint: " + e.what() +
                        " (choose a free port, or 0 for any)");
    }
    // A node's place is known before the first round only in a static job (--node_rank).
    const bool placed = multi_node_ && o.rdzv_backend == cli::RdzvBackend::Static;
    health_->view().set_identity(o.run_id, host_, placed ? o.node_rank : -1, o.max_nodes);
    // A replica group under its own world's run id (JOB.rgN, as the log names it), so that
    // ddprun-top tells the groups of one job on this host apart.
    health_->advertise(o.replica_group ? rdzv::jobs::replica_group_run_id(o.run_id, *o.replica_group) : o.run_id,
                       command_line(200));
    supervisor_.set_on_stopping([this](const GroupResult& so_far) { view_stopping(so_far); });
    log::info("ddprun") << "job page at http://localhost:" << health_->port()
                        << "/ui (this host only), Prometheus metrics at /metrics, health at / (" << given << ")";
  }
  if (!o.trace_file.empty()) {
    const std::string path = expand_report_path(o.trace_file, host_);
    trace_ = std::make_unique<view::TraceFile>(path, host_);
    log::info("ddprun") << "trace of the job: " << path << " (open it in ui.perfetto.dev or chrome://tracing)";
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
    write_python_hook(python_hook_dir_, o.replica_group.has_value());
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
  if (options_.preload.empty()) return;
  const std::vector<std::string> command = worker_command(options_, base_env_);
  if (command.size() < 2 || command[1] != "-u") {
    log::info("ddprun") << "--preload applies to Python programs (PROGRAM.py, -m MODULE): " << options_.program
                        << " is started as it is";
    return;
  }
  Environment env = base_env_;
  if (!python_hook_dir_.empty()) {
    auto pp = env.find("PYTHONPATH");
    env["PYTHONPATH"] = python_hook_dir_ + (pp != env.end() && !pp->second.empty() ? ":" + pp->second : "");
  }
  try {
    zygote_ = std::make_unique<Zygote>(command[0], options_.preload, to_envp(env),
                                       (run_dir_.path / "zygote.sock").string(), &guard_);
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
      for (const std::string& m : options_.preload) modules += (modules.empty() ? "" : ",") + m;
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
  if (options_.numa_binding == NumaBinding::Off) return;
  // The GPUs of the vendor the ranks use (NVIDIA's unless the job counted AMD's or Intel's).
  const GpuMaker maker = options_.gpu_vendor == cli::GpuVendor::Amd     ? GpuMaker::Amd
                         : options_.gpu_vendor == cli::GpuVendor::Intel ? GpuMaker::Intel
                                                                        : GpuMaker::Nvidia;
  const Topology topology = read_topology(options_.topology_root, allowed_cpus(), maker);
  const auto env = [this](const std::string& name) -> std::optional<std::string> {
    if (auto it = base_env_.find(name); it != base_env_.end()) return it->second;
    return std::nullopt;
  };
  std::string why;
  const auto gpus = visible_gpus_of(topology, maker, env, &why);
  if (!gpus) log::warn("ddprun") << "--numa_binding: " << why << "; the workers are placed as CPU workers";
  placements_ =
      place_ranks(topology, options_.numa_binding, options_.nproc_per_node, gpus.value_or(std::vector<int>{}));
  omp_threads_per_rank_ = base_env_.find("OMP_NUM_THREADS") == base_env_.end();
  const std::string mode = numa_binding_name(options_.numa_binding);
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

}  // namespace ddprun::launcher::agent
