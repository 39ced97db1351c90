#include "launcher/agent.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/ip/address.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/console.hpp"
#include "launcher/local_rendezvous.hpp"
#include "launcher/signals.hpp"
#include "launcher/stop.hpp"
#include "launcher/store_rendezvous.hpp"
#include "launcher/stacks.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/watchdog.hpp"
#include "launcher/worker_env.hpp"
#include "rendezvous/auth.hpp"
#include "rendezvous/server.hpp"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

// The exit code of a job that hung (--hang_timeout), as timeout(1) has it.
constexpr int kHangExitCode = 124;

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

// Creates `dir` (and missing parents) readable by this user alone: worker logs and error files
// hold whatever the workers print.
void create_private_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) throw ConfigError("cannot create the log directory " + dir.string() + ": " + ec.message());
}

// Where attempt directories go: LOG_DIR/RUN_ID_XXXX, or a temporary directory removed at exit
// when nothing was asked to be kept. Private (0700), as is everything ddprun creates in it.
struct RunDirectory {
  fs::path path;
  bool temporary = false;

  explicit RunDirectory(const LaunchOptions& o) {
    std::error_code ec;
    if (!o.log_dir.empty()) {
      path = fs::path(o.log_dir) / (o.run_id + "_" + random_suffix());
    } else {
      path = fs::temp_directory_path(ec) / ("ddprun_" + o.run_id + "_" + random_suffix());
      temporary = !o.redirects.any() && !o.tee.any();
    }
    create_private_directory(path);
  }
  ~RunDirectory() {
    std::error_code ec;
    if (temporary) fs::remove_all(path, ec);
  }
  // Something worth keeping was written (stacks of a hang): the directory stays after the job.
  void keep() {
    if (!temporary) return;
    temporary = false;
    log::info("ddprun") << "keeping " << path.string() << " (stacks and reports)";
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

// Every numeric address of `names` (addresses or host names), for an allow list.
std::vector<std::string> resolve_all(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (name.empty()) continue;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) {
      log::warn("ddprun") << "cannot resolve node address '" << name << "': its workers may be refused by the worker store";
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

// How the Ending state leaves a round.
struct Decision {
  enum class Kind { Finish, Restart, Rerendezvous } kind = Kind::Finish;
  int exit_code = 0;
};

class Agent {
 public:
  explicit Agent(const LaunchOptions& o);
  ~Agent();
  int run();

 private:
  void on_signal(int signo);
  std::unique_ptr<RendezvousBackend> make_backend();
  std::optional<rdzv::Token> read_token() const;
  uint16_t host_worker_store();
  fs::path attempt_directory(const World& world) const;
  std::vector<WorkerLaunch> make_launches(const World& world, const fs::path& attempt_dir, const Watchdog& watchdog);
  std::unique_ptr<Watchdog> make_watchdog(const World& world, const fs::path& attempt_dir);
  void on_hang(const RoundEnd& end);
  void start_watch(int round);
  // The states.
  std::variant<World, RoundEnd> rendezvous(int round);
  GroupResult running(const World& world);
  RoundEnd agree_on_end(int round, const GroupResult& result);
  Decision decide(const RoundEnd& end, const GroupResult& result);
  int finish(int round, const World& world, const RoundEnd& end, const GroupResult& result, int exit_code);
  void print_rates();
  void show_hang_report(const World& world, const RoundEnd& end);

  const LaunchOptions& o_;
  const bool multi_node_;
  StopSignal stop_;
  OrphanGuard guard_;  // before any thread or socket exists, so it inherits nothing worth keeping
  Environment base_env_;
  std::string host_;
  std::string signals_text_;
  std::optional<std::vector<std::string>> gpus_;
  RunDirectory run_dir_;
  Supervisor supervisor_;
  std::unique_ptr<SignalWatcher> signals_;  // after supervisor_: destroyed (joined) before it
  std::unique_ptr<RendezvousBackend> backend_;
  std::unique_ptr<rdzv::ServerThread> worker_store_;
  std::string advertise_addr_;  // the address other nodes (and the workers) use for this node
  // Stack capture (for --hang_timeout and torchelastic's file timer): the workers' Python hook.
  const bool file_timer_;
  const bool capture_stacks_;
  std::string timer_file_;
  std::string python_hook_dir_;
  std::unique_ptr<Watchdog> watchdog_;  // the current round's
  fs::path attempt_dir_;
  int restarts_ = 0;
  bool watching_ = false;
  std::mutex seen_mutex_;
  std::optional<RoundEnd> seen_end_;  // the round's end as the watcher saw it
};

Agent::Agent(const LaunchOptions& o)
    : o_(o),
      multi_node_(o.max_nodes > 1 || o.rdzv_backend == "c10d"),
      base_env_(current_environment()),
      host_(host_name()),
      run_dir_(o),
      supervisor_(SupervisorSettings{o.shutdown_timeout, host_name(), multi_node_ ? o.node_rank : -1, 12}, &guard_),
      file_timer_(base_env_.count("TORCHELASTIC_ENABLE_FILE_TIMER") && base_env_["TORCHELASTIC_ENABLE_FILE_TIMER"] == "1"),
      capture_stacks_(o.hang_timeout.count() > 0 || file_timer_) {
  become_subreaper();
  if (file_timer_) {
    // As torchrun: the user's TORCHELASTIC_TIMER_FILE, else one of ddprun's (private) own.
    auto it = base_env_.find("TORCHELASTIC_TIMER_FILE");
    timer_file_ = it != base_env_.end() && !it->second.empty() ? it->second : (run_dir_.path / "torchelastic_timer").string();
  }
  if (capture_stacks_) {
    python_hook_dir_ = (run_dir_.path / "python").string();
    create_private_directory(python_hook_dir_);
    write_python_stack_hook(python_hook_dir_);
  }
  if (o.nproc_per_node > 1 && base_env_.find("OMP_NUM_THREADS") == base_env_.end()) {
    base_env_["OMP_NUM_THREADS"] = "1";
    log::warn("ddprun") << "OMP_NUM_THREADS is not set: setting it to 1 for each of the " << o.nproc_per_node
                        << " workers to avoid oversubscribing the CPUs; set it yourself to tune";
  }
  for (int s : o.signals_to_handle) signals_text_ += (signals_text_.empty() ? "" : ",") + signal_name(s);
  if (o.virtual_local_rank) gpus_ = visible_gpu_ids(base_env_, o.nproc_per_node);
  signals_ = std::make_unique<SignalWatcher>(o.signals_to_handle, [this](int s) { on_signal(s); });
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

std::unique_ptr<RendezvousBackend> Agent::make_backend() {
  // The address other nodes (and the workers) use for this node: --local_addr; else node 0 of a
  // static job is --master_addr, and any other node is known by its host name.
  const bool static_node_zero = o_.rdzv_backend != "c10d" && o_.node_rank == 0;
  advertise_addr_ = !o_.local_addr.empty() ? o_.local_addr : (!multi_node_ || static_node_zero ? o_.master_addr : host_);
  if (!multi_node_) return std::make_unique<LocalRendezvous>(advertise_addr_);
  StoreRendezvousOptions ro;
  ro.run_id = o_.run_id;
  ro.dynamic = o_.rdzv_backend == "c10d";
  ro.min_nodes = o_.min_nodes;
  ro.nnodes = o_.max_nodes;
  ro.node_rank = ro.dynamic && !o_.node_rank_given ? -1 : o_.node_rank;
  ro.last_call_timeout = o_.last_call_timeout;
  ro.master_addr = o_.master_addr;
  ro.master_port = o_.master_port.value_or(29500);
  ro.endpoint_host = o_.rdzv_endpoint_host;
  ro.endpoint_port = o_.rdzv_endpoint_port;
  ro.advertise_addr = advertise_addr_;
  ro.host = host_;
  ro.token = read_token();
  ro.token_file = o_.token_file;
  ro.join_timeout = o_.join_timeout;
  ro.keep_alive_interval = o_.keep_alive_interval;
  ro.keep_alive_max_attempt = o_.keep_alive_max_attempt;
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
  return run_dir_.path /
         ("attempt_" + std::to_string(restarts_) + (world.round != restarts_ ? "_round_" + std::to_string(world.round) : ""));
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
  // How often step rates are published and checked for stragglers (seconds, default 10).
  if (auto it = base_env_.find("DDPRUN_STEP_RATES_PERIOD"); it != base_env_.end()) {
    try {
      const double v = std::stod(it->second);
      if (v >= 0.5 && v <= 3600) ws.rates_period = std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
      else throw std::out_of_range(it->second);
    } catch (const std::exception&) {
      log::warn("ddprun") << "DDPRUN_STEP_RATES_PERIOD: expected seconds between 0.5 and 3600, got '" << it->second
                          << "'; using 10";
    }
  }
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
  std::vector<WorkerLaunch> launches;
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
    env["DDPRUN_PROGRESS_FILE"] = watchdog.progress_file(lr);
    if (capture_stacks_) {
      env["DDPRUN_STACK_DIR"] = rank_dir.string();
      env["DDPRUN_STACK_SIGNAL"] = std::to_string(stack_signal());
      auto pp = env.find("PYTHONPATH");
      env["PYTHONPATH"] = python_hook_dir_ + (pp != env.end() && !pp->second.empty() ? ":" + pp->second : "");
    }
    if (file_timer_) env["TORCHELASTIC_TIMER_FILE"] = timer_file_;
    l.request.argv = worker_command(o_, env);
    for (auto& a : substitute_args(o_.program_args, lr)) l.request.argv.push_back(std::move(a));
    l.request.envp = to_envp(env);
    l.prefix = expand_prefix(o_.log_line_prefix, where.rank, lr, o_.role, host_);
    const int redirect = o_.redirects.for_rank(lr), tee = o_.tee.for_rank(lr);
    const bool shown = !o_.local_ranks_filter || o_.local_ranks_filter->count(lr) != 0;
    l.stdout_to_console = shown && (!(redirect & 1) || (tee & 1));
    l.stderr_to_console = shown && (!(redirect & 2) || (tee & 2));
    if ((redirect | tee) & 1) l.stdout_file = (rank_dir / "stdout.log").string();
    if ((redirect | tee) & 2) l.stderr_file = (rank_dir / "stderr.log").string();
    launches.push_back(std::move(l));
  }
  if (o_.redirects.any() || o_.tee.any()) log::info("ddprun") << "worker logs in " << attempt_dir.string();
  return launches;
}

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
  auto joined = backend_->join(round, o_.nproc_per_node, [this] { return host_worker_store(); }, stop_);
  if (auto* w = std::get_if<World>(&joined)) {
    if (multi_node_ && worker_store_ && w->group_rank == 0) {
      // Now the job's nodes are known: their workers may connect, nobody else's.
      std::vector<std::string> peers = w->peer_addresses;
      peers.push_back(advertise_addr_);
      worker_store_->allow_peers(resolve_all(peers));
    }
    if (multi_node_) {
      log::info("ddprun") << "round " << w->round << " (restart " << restarts_ << "): node " << w->group_rank << " of "
                          << w->group_world_size << ", ranks " << w->rank_offset << ".."
                          << w->rank_offset + o_.nproc_per_node - 1 << " of " << w->world_size
                          << ", MASTER_ADDR=" << w->master_addr << " MASTER_PORT=" << w->master_port;
    } else {
      log::info("ddprun") << "attempt " << restarts_ << ": worker store on "
                          << rdzv::format_endpoint(worker_store_->endpoint()) << ", MASTER_ADDR=" << w->master_addr
                          << " MASTER_PORT=" << w->master_port;
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
  supervisor_.request_stop("the job hung: " + end.detail);
}

GroupResult Agent::running(const World& world) {
  attempt_dir_ = attempt_directory(world);
  watchdog_.reset();
  watchdog_ = make_watchdog(world, attempt_dir_);
  std::vector<WorkerLaunch> launches = make_launches(world, attempt_dir_, *watchdog_);
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
  {
    std::lock_guard lock(seen_mutex_);
    seen_end_.reset();
  }
  // The worker store's changes are progress signals; it lives on the node of group rank 0.
  rdzv::ServerThread* store = !multi_node_ || world.group_rank == 0 ? worker_store_.get() : nullptr;
  GroupResult result = supervisor_.run(launches, [&](const std::vector<pid_t>& pids) {
    watchdog_->start(pids, store, std::move(channel), [this](const RoundEnd& end) { on_hang(end); },
                     [this] {
                       std::lock_guard lock(seen_mutex_);
                       return supervisor_.group_running() && !seen_end_;
                     });
  });
  watchdog_->stop();
  // What the watchdog saw goes into the failure report.
  const auto notes = watchdog_->timer_notes();
  for (auto& f : result.failures) {
    if (auto it = notes.find(f.rank); it != notes.end()) f.diagnosis = it->second;
  }
  if (watchdog_->wrote_diagnosis()) run_dir_.keep();
  return result;
}

void Agent::show_hang_report(const World& world, const RoundEnd& end) {
  // In the run directory of every node; on the console of the node that diagnosed it (one report
  // for the job), a pointer to it on the others.
  const fs::path file = attempt_dir_ / "hang_report.txt";
  {
    std::ofstream out(file, std::ios::trunc);
    out << (end.report.empty() ? end.detail + "\n" : end.report);
  }
  std::error_code ec;
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace, ec);
  run_dir_.keep();
  const bool diagnosed_here = !multi_node_ || end.root_node == world.group_rank;
  if (diagnosed_here && !end.report.empty()) {
    if (ConsoleWriter* err = consoles().err) err->write(end.report);
  } else {
    log::error("ddprun") << "the job hung (diagnosed by node " << end.root_node << "): " << end.detail
                         << "; the full report is on that node's console";
  }
  log::error("ddprun") << "hang report: " << file.string();
}

void Agent::print_rates() {
  if (!watchdog_) return;
  const std::string table = watchdog_->rates_report();
  if (table.empty()) return;
  if (ConsoleWriter* err = consoles().err) err->write(table);
}

RoundEnd Agent::agree_on_end(int round, const GroupResult& result) {
  switch (result.outcome) {
    case GroupOutcome::Succeeded:
      if (multi_node_) log::info("ddprun") << "this node's workers all finished; waiting for the other nodes to finish";
      return backend_->report_success(round, stop_);
    case GroupOutcome::Failed: return backend_->report_failure(round, result.failures.front());
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

Decision Agent::decide(const RoundEnd& end, const GroupResult& result) {
  const bool stopping = stop_.requested();
  switch (end.kind) {
    case RoundEnd::Kind::Success: return {Decision::Kind::Finish, 0};
    case RoundEnd::Kind::Signal: {
      const int signo = stop_.signo() ? stop_.signo() : (result.signal ? result.signal : SIGTERM);
      return {Decision::Kind::Finish, 128 + signo};
    }
    case RoundEnd::Kind::StoreLost: return {Decision::Kind::Finish, 1};
    case RoundEnd::Kind::NodeLost:
      // Elastic: the survivors go on without it if at least MIN of them rendezvous again. Static
      // membership cannot go on without that node.
      if (backend_->elastic() && !stopping) return {Decision::Kind::Rerendezvous, 0};
      return {Decision::Kind::Finish, 1};
    case RoundEnd::Kind::Membership:
      if (stopping) return {Decision::Kind::Finish, 128 + stop_.signo()};
      return {Decision::Kind::Rerendezvous, 0};
    case RoundEnd::Kind::Failure:
      if (restarts_ < o_.max_restarts && !stopping) return {Decision::Kind::Restart, 0};
      return {Decision::Kind::Finish, end.root_cause ? shell_exit_code(*end.root_cause) : 1};
    case RoundEnd::Kind::Hang:
      if (restarts_ < o_.max_restarts && !stopping) return {Decision::Kind::Restart, 0};
      return {Decision::Kind::Finish, kHangExitCode};
  }
  return {Decision::Kind::Finish, 1};
}

int Agent::finish(int round, const World& world, const RoundEnd& end, const GroupResult& result, int exit_code) {
  switch (end.kind) {
    case RoundEnd::Kind::Success:
      if (multi_node_) {
        log::info("ddprun") << "all " << world.world_size << " worker(s) on " << world.group_world_size
                            << " nodes finished successfully";
      } else {
        log::info("ddprun") << "all " << o_.nproc_per_node << " worker(s) finished successfully";
      }
      break;
    case RoundEnd::Kind::Signal:
      log::warn("ddprun") << (multi_node_ ? "job stopped by " : "workers stopped by ") << end.detail;
      break;
    case RoundEnd::Kind::StoreLost:
      log::error("ddprun") << end.detail;
      return exit_code;  // nothing to leave: the store is gone
    case RoundEnd::Kind::NodeLost:
      log::error("ddprun") << "job stopped: " << end.detail;
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
      const std::string report = format_failure_report(o_.program, failures, result.stopped_ranks);
      if (ConsoleWriter* err = consoles().err) err->write(report);
      if (o_.max_restarts > 0) log::error("ddprun") << "giving up after " << o_.max_restarts << " restart(s)";
      break;
    }
    case RoundEnd::Kind::Hang:
      // The report is out already (show_hang_report).
      if (o_.max_restarts > 0) log::error("ddprun") << "giving up after " << o_.max_restarts << " restart(s)";
      break;
  }
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
  try {
    backend_ = make_backend();
    round = backend_->first_round(stop_);
  } catch (const StopRequested& s) {
    log::warn("ddprun") << "received " << signal_name(s.signal()) << " before the rendezvous: no worker was started";
    return 128 + s.signal();
  }
  for (;;) {
    switch (state) {
      case State::Rendezvous: {
        std::variant<World, RoundEnd> joined;
        try {
          joined = rendezvous(round);
        } catch (const StopRequested& s) {
          log::warn("ddprun") << "received " << signal_name(s.signal())
                              << " during the rendezvous: left it; no worker was started";
          return 128 + s.signal();
        }
        if (auto* ended = std::get_if<RoundEnd>(&joined)) {
          // Another node stopped or failed before the round could start.
          end = *ended;
          result = GroupResult{};
          state = State::Ending;
          break;
        }
        world = std::get<World>(joined);
        round = world.round;  // a node arriving late joins the job's next round
        state = State::Running;
        break;
      }
      case State::Running:
        result = running(world);
        end = agree_on_end(round, result);
        print_rates();
        if (end.kind == RoundEnd::Kind::Hang) show_hang_report(world, end);
        state = State::Ending;
        break;
      case State::Ending: {
        if (watching_) {
          backend_->unwatch();
          watching_ = false;
        }
        const Decision d = decide(end, result);
        switch (d.kind) {
          case Decision::Kind::Finish: return finish(round, world, end, result, d.exit_code);
          case Decision::Kind::Restart:
            ++restarts_;
            log::warn("ddprun") << end.detail << "; restarting the worker group"
                                << (multi_node_ ? "s of all " + std::to_string(world.group_world_size) + " nodes" : "")
                                << " (restart " << restarts_ << " of " << o_.max_restarts << ")";
            break;
          case Decision::Kind::Rerendezvous:
            log::warn("ddprun") << end.detail << "; re-rendezvous"
                                << (end.kind == RoundEnd::Kind::NodeLost ? " without it" : " to admit it")
                                << " (not counted as a restart)";
            break;
        }
        ++round;
        state = State::Rendezvous;
        break;
      }
    }
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
  try {
    Agent agent(o);
    code = agent.run();
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

}  // namespace ddprun::launcher
