#include "launcher/cli/options.hpp"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/command_line.hpp"
#include "common/errors.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options_parse.hpp"
#include "rendezvous/core/job_keys.hpp"

namespace ddprun::launcher::cli {

using workers::parse_numa_binding;
namespace {

using namespace options_detail;

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

StreamSelection parse_streams(const std::string& flag, const std::string& text) {
  const std::string expected = "0 (none), 1 (stdout), 2 (stderr), 3 (both) or per local rank like '0:1,1:3'";
  StreamSelection sel;
  if (text.find(':') == std::string::npos) {
    sel.all = static_cast<int>(parse_int(flag, trim(text), 0, 3, expected));
    return sel;
  }
  for (const std::string& item : split(text, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) bad(flag, expected, text);
    const int lr = static_cast<int>(parse_int(flag, trim(item.substr(0, colon)), 0, 1 << 20, expected));
    sel.per_rank[lr] = static_cast<int>(parse_int(flag, trim(item.substr(colon + 1)), 0, 3, expected));
  }
  return sel;
}

// 1. argv -> flags and the program; stops at the first argument that is not a flag (or "--").
Given tokenize(const std::vector<std::string>& args) {
  using command_line::FlagShape;
  using command_line::Takes;
  Given g;
  auto lookup = [](const std::string& name) -> std::optional<FlagShape> {
    if (name == "-h" || name == "--help" || name == "--version") return FlagShape{};
    const FlagDef* f = find_flag(name);
    if (!f) return std::nullopt;
    return FlagShape{f->takes_value ? Takes::Value : f->optional_value ? Takes::InlineValue : Takes::Nothing, f->help};
  };
  auto on_flag = [&](const std::string& name, const std::optional<std::string>& value) {
    if (name == "-h" || name == "--help") g.help = true;
    else if (name == "--version") g.version = true;
    else g.set(find_flag(name)->dest, value.value_or("1"), name);
    return !g.help && !g.version;
  };
  const size_t rest = command_line::walk(args, 0, lookup, on_flag, " (see ddprun --help for the list)");
  if (g.help || g.version || rest >= args.size()) return g;
  g.program = args[rest];
  g.program_args.assign(args.begin() + static_cast<long>(rest) + 1, args.end());
  return g;
}

// 2a. PET_<DEST> for every flag not given, as torchrun reads them (Kubeflow's PyTorchJob sets these).
void apply_pet_fallbacks(Given& g, const EnvLookup& env) {
  for (const FlagDef& f : flag_table()) {
    if (g.has(f.dest)) continue;
    const std::string var = "PET_" + upper(f.dest);
    auto v = env(var);
    if (!v || v->empty()) continue;
    if (f.takes_value) {
      g.set(f.dest, *v, var);
      continue;
    }
    // torchrun's check_env: a non-zero integer means on.
    const auto on = to_int(trim(*v));
    if (!on) throw ConfigError(var + ": expected an integer (0 off, non-zero on), got '" + *v + "'");
    if (*on == 0) continue;
    g.set(f.dest, "1", var);
  }
}

// 2b. Under Slurm (srun ddprun ...), the job's layout comes from its environment unless given.
void apply_slurm(Given& g, const EnvLookup& env) {
  const auto job = env("SLURM_JOB_ID"), nodes = env("SLURM_NNODES"), node = env("SLURM_NODEID"),
             list = env("SLURM_JOB_NODELIST");
  if (!job || !nodes || !node || !list || g.has("nnodes") || g.has("node_rank") || g.has("master_addr")) return;
  g.set("nnodes", *nodes, "SLURM_NNODES");
  g.set("node_rank", *node, "SLURM_NODEID");
  g.set("master_addr", first_slurm_host(*list), "SLURM_JOB_NODELIST");
  if (!g.has("master_port")) {
    // The same on every node of the job, and below Linux's ephemeral port range.
    const long long id = parse_int("SLURM_JOB_ID", trim(*job), 0, (1LL << 62), "a job number");
    g.set("master_port", std::to_string(20000 + id % 12000), "SLURM_JOB_ID");
  }
  if (!g.has("rdzv_id")) g.set("rdzv_id", "slurm-" + trim(*job), "SLURM_JOB_ID");
}

// 3a. How many workers and nodes, and where node 0's store is.
// PyTorch's "cuda" devices on this host and whose they are: NVIDIA's when any is there (or
// CUDA_VISIBLE_DEVICES names some and no AMD GPU is), else AMD's.
std::pair<int, GpuVendor> cuda_devices(const HostFacts& host) {
  if (host.gpu_count > 0 && (host.nvidia_devices || host.amd_count == 0)) return {host.gpu_count, GpuVendor::Nvidia};
  if (host.amd_count > 0) return {host.amd_count, GpuVendor::Amd};
  return {0, GpuVendor::None};
}

void resolve_layout(const Given& g, const HostFacts& host, LaunchOptions& o) {
  if (g.has("nproc_per_node")) {
    const std::string v = trim(g["nproc_per_node"]);
    o.nproc_spec = v;
    if (v == "cpu") {
      o.nproc_per_node = host.cpu_count;
    } else if (v == "xpu") {
      if (host.xpu_count == 0) {
        throw ConfigError(g.flag("nproc_per_node") + " xpu: no Intel GPU is visible (no render node of an Intel GPU "
                          "under /sys/class/drm, or ZE_AFFINITY_MASK lists none)");
      }
      o.nproc_per_node = host.xpu_count;
      o.gpu_vendor = GpuVendor::Intel;
    } else if (v == "gpu" || v == "cuda") {
      // PyTorch's "cuda" devices: NVIDIA's, or AMD's under ROCm.
      const auto [count, vendor] = cuda_devices(host);
      if (count == 0) {
        throw ConfigError(g.flag("nproc_per_node") + " " + v + ": no GPU is visible (no /dev/nvidia* device or AMD "
                          "GPU in the KFD topology, or CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES or "
                          "ROCR_VISIBLE_DEVICES lists none); use a number, 'cpu' or 'xpu'");
      }
      o.nproc_per_node = count;
      o.gpu_vendor = vendor;
    } else if (v == "auto") {
      const auto [count, vendor] = cuda_devices(host);
      if (count > 0) {
        o.nproc_per_node = count;
        o.gpu_vendor = vendor;
      } else if (host.xpu_count > 0) {
        o.nproc_per_node = host.xpu_count;
        o.gpu_vendor = GpuVendor::Intel;
      } else {
        o.nproc_per_node = host.cpu_count;
      }
    } else {
      o.nproc_per_node = static_cast<int>(
          parse_int(g.flag("nproc_per_node"), v, 1, 1 << 16, "a positive number, 'auto', 'cpu', 'gpu', 'cuda' or 'xpu'"));
    }
  }
  if (o.gpu_vendor == GpuVendor::None) {  // a number of workers: the GPUs this host has, if any
    const auto [count, vendor] = cuda_devices(host);
    o.gpu_vendor = count > 0 ? vendor : host.xpu_count > 0 ? GpuVendor::Intel : GpuVendor::None;
  }
  if (g.has("nnodes")) {
    const std::string v = trim(g["nnodes"]);
    const std::string expected = "N or MIN:MAX with 0 < MIN <= MAX";
    const auto colon = v.find(':');
    if (colon == std::string::npos) {
      o.min_nodes = o.max_nodes = static_cast<int>(parse_int(g.flag("nnodes"), v, 1, 1 << 20, expected));
    } else {
      o.min_nodes = static_cast<int>(parse_int(g.flag("nnodes"), trim(v.substr(0, colon)), 1, 1 << 20, expected));
      o.max_nodes = static_cast<int>(parse_int(g.flag("nnodes"), trim(v.substr(colon + 1)), 1, 1 << 20, expected));
      if (o.min_nodes > o.max_nodes) bad(g.flag("nnodes"), expected, v);
    }
  }
  o.node_rank_given = g.has("node_rank");
  if (g.has("node_rank")) {
    o.node_rank = static_cast<int>(parse_int(g.flag("node_rank"), trim(g["node_rank"]), 0, o.max_nodes - 1,
                                             "a node rank from 0 to " + std::to_string(o.max_nodes - 1) +
                                                 " (--nnodes is " + std::to_string(o.max_nodes) + ")"));
  }
  if (g.has("master_addr")) {
    o.master_addr = trim(g["master_addr"]);
    // torchrun accepts IPv6 in brackets.
    if (o.master_addr.size() > 2 && o.master_addr.front() == '[' && o.master_addr.back() == ']') {
      o.master_addr = o.master_addr.substr(1, o.master_addr.size() - 2);
    }
    if (o.master_addr.empty()) bad(g.flag("master_addr"), "a host name or address", g["master_addr"]);
  }
  if (g.has("master_port")) {
    const auto port = parse_int(g.flag("master_port"), trim(g["master_port"]), 0, 65535, "a port from 0 to 65535");
    if (port != 0) o.master_port = static_cast<uint16_t>(port);
  }
  o.standalone = g.has("standalone");
  if (g.has("local_addr")) o.local_addr = trim(g["local_addr"]);
}

// 3c. How the workers run, restart, log and get signals: supervision, where their output and the
// reports go, how the program is started, and the signals.
void resolve_supervision(const Given& g, const EnvLookup& env, LaunchOptions& o) {
  if (auto v = env("TORCHELASTIC_HEALTH_CHECK_PORT"); v && !trim(*v).empty()) {
    o.health_check_port = static_cast<uint16_t>(
        parse_int("TORCHELASTIC_HEALTH_CHECK_PORT", trim(*v), 0, 65535, "a port from 1 to 65535 (0: any free port)"));
  }
  if (g.has("max_restarts")) {
    o.max_restarts = static_cast<int>(
        parse_int(g.flag("max_restarts"), trim(g["max_restarts"]), 0, 1 << 20, "a whole number >= 0"));
  }
  if (auto v = env("DDPRUN_PROGRESS_INTERVAL"); v && !trim(*v).empty()) {
    o.progress_interval = parse_seconds("DDPRUN_PROGRESS_INTERVAL", trim(*v), false);
  }
  if (auto v = env("DDPRUN_STEP_RATES_PERIOD"); v && !trim(*v).empty()) {
    const auto period = to_double(trim(*v));
    if (!period || *period < 0.5 || *period > 3600) {
      bad("DDPRUN_STEP_RATES_PERIOD", "seconds from 0.5 to 3600 (default 10)", *v);
    }
    o.step_rates_period = std::chrono::milliseconds(static_cast<int64_t>(*period * 1000));
  }
  // As torchrun: on when it is "1".
  if (auto v = env("TORCHELASTIC_ENABLE_FILE_TIMER")) o.file_timer = trim(*v) == "1";
  if (auto v = env("TORCHELASTIC_TIMER_FILE")) o.timer_file = trim(*v);
  if (g.has("hang_timeout")) o.hang_timeout = parse_seconds(g.flag("hang_timeout"), trim(g["hang_timeout"]), true);
  if (o.hang_timeout.count() > 0 && o.hang_timeout < std::chrono::seconds(2)) {
    bad(g.flag("hang_timeout"), "0 (off) or at least 2 seconds", g["hang_timeout"]);
  }
  if (g.has("straggler_factor")) {
    const std::string text = trim(g["straggler_factor"]);
    const auto v = to_double(text);
    if (!v || !(*v == 0 || (*v > 1 && *v < 1000))) {
      bad(g.flag("straggler_factor"), "0 (off) or a factor above 1, such as 1.5", g["straggler_factor"]);
    }
    o.straggler_factor = *v;
  }
  // Accepted for compatibility (worker exits are seen at once); a malformed value is still an error.
  if (g.has("monitor_interval")) parse_seconds(g.flag("monitor_interval"), trim(g["monitor_interval"]), false);
}

// "a,b,,c" -> {"a", "b,c"}: torchrun's filter lists, where ",," is a comma inside a filter. Empty
// filters (which every line contains) are dropped.
std::vector<std::string> split_filters(const std::string& text) {
  std::vector<std::string> out;
  std::string current;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      current.push_back(text[i]);
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      current.push_back(',');
      ++i;
    } else {
      if (!current.empty()) out.push_back(current);
      current.clear();
    }
  }
  if (!current.empty()) out.push_back(current);
  return out;
}

void resolve_output(const Given& g, const EnvLookup& env, LaunchOptions& o) {
  if (g.has("role")) {
    o.role = trim(g["role"]);
    if (o.role.empty()) bad(g.flag("role"), "a non-empty role name", g["role"]);
  }
  if (g.has("log_dir")) o.log_dir = g["log_dir"];
  if (g.has("numa_binding")) {
    const std::string v = trim(g["numa_binding"]);
    const auto mode = parse_numa_binding(v);
    if (!mode) bad(g.flag("numa_binding"), "node, socket, exclusive or core-complex", g["numa_binding"]);
    o.numa_binding = *mode;
  }
  if (auto v = env("DDPRUN_TOPOLOGY_ROOT"); v && !trim(*v).empty()) o.topology_root = trim(*v);
  if (auto v = env("DDPRUN_REPORT_FILE"); v && !trim(*v).empty()) o.report_file = trim(*v);
  if (g.has("report_file")) {  // the flag wins over the environment
    o.report_file = trim(g["report_file"]);
    if (o.report_file.empty()) bad(g.flag("report_file"), "a file path", g["report_file"]);
  }
  for (const char* dest : {"duplicate_stdout_filters", "duplicate_stderr_filters"}) {
    if (!g.has(dest)) continue;
    auto& filters = std::string_view(dest) == "duplicate_stdout_filters" ? o.duplicate_stdout_filters
                                                                         : o.duplicate_stderr_filters;
    filters = split_filters(g[dest]);
    if (filters.empty()) bad(g.flag(dest), "substrings separated by commas (',,' for a comma inside one)", g[dest]);
  }
  if (g.has("merge_lines")) {
    o.merge_lines = parse_seconds(g.flag("merge_lines"), trim(g["merge_lines"]), true);
    if (o.merge_lines > std::chrono::minutes(1)) {
      bad(g.flag("merge_lines"), "a window of at most 60 seconds (the console waits that long for each line)",
          g["merge_lines"]);
    }
  }
  if (g.has("redirects")) o.redirects = parse_streams(g.flag("redirects"), g["redirects"]);
  if (g.has("tee")) o.tee = parse_streams(g.flag("tee"), g["tee"]);
  if (g.has("local_ranks_filter") && !trim(g["local_ranks_filter"]).empty()) {
    std::set<int> ranks;
    for (const std::string& r : split(g["local_ranks_filter"], ',')) {
      ranks.insert(static_cast<int>(parse_int(g.flag("local_ranks_filter"), r, 0, 1 << 20,
                                              "comma-separated local ranks such as '0' or '0,2'")));
    }
    o.local_ranks_filter = std::move(ranks);
  }
  if (g.has("log_line_prefix_template")) o.log_line_prefix = g["log_line_prefix_template"];
  else if (auto v = env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); v) o.log_line_prefix = *v;
}

// --preload's modules: dotted Python names, each checked, so a typo is an error before any import.
std::vector<std::string> parse_preload(const std::string& where, const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& m : split(text, ',')) {
    if (m.empty()) continue;
    bool ok = !std::isdigit(static_cast<unsigned char>(m.front())) && m.front() != '.' && m.back() != '.' &&
              m.find("..") == std::string::npos;
    for (char c : m) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.');
    if (!ok) bad(where, "Python module names separated by commas, such as torch,numpy", m);
    out.push_back(m);
  }
  return out;
}

void resolve_invocation(const Given& g, const EnvLookup& env, LaunchOptions& o) {
  if (g.has("preload")) o.preload = parse_preload(g.flag("preload"), g["preload"]);
  else if (auto v = env("DDPRUN_PRELOAD"); v && !trim(*v).empty()) o.preload = parse_preload("DDPRUN_PRELOAD", *v);
  o.no_python = g.has("no_python");
  o.module = g.has("module");
  o.run_path = g.has("run_path");
  if (g.has("event_log_handler")) {
    const std::string v = trim(g["event_log_handler"]);
    if (v != "null" && v != "console") {
      bad(g.flag("event_log_handler"), "'null' or 'console' (ddprun has no registry of Python event handlers: its "
          "events are its log lines on stderr and the --report_file JSON document)", v);
    }
  }
  if (g.has("logs_specs") && trim(g["logs_specs"]) != "default") {
    bad(g.flag("logs_specs"), "'default' (ddprun cannot load Python entry points; it writes torchrun's default layout: "
        "set where with --log_dir and what with --redirects and --tee)", g["logs_specs"]);
  }
  if (g.has("local_rank_arg")) {
    const std::string v = trim(g["local_rank_arg"]);
    if (v == "1" || v == "underscore") {
      o.local_rank_arg = LocalRankArg::Underscore;
    } else if (v == "dash") {
      o.local_rank_arg = LocalRankArg::Dash;
    } else {
      bad(g.flag("local_rank_arg"), "no value (--local_rank=N, torch.distributed.launch 1.x), 'underscore' (the same) "
          "or 'dash' (--local-rank=N, 2.x)", g["local_rank_arg"]);
    }
  }
  if (o.local_rank_arg != LocalRankArg::None && g.has("use_env")) {
    throw ConfigError("--local_rank_arg and --use_env contradict each other: --use_env is torch.distributed.launch's "
                      "way of saying 'no --local_rank argument'; keep one");
  }
  o.virtual_local_rank = g.has("virtual_local_rank");
}

void resolve_signals(const Given& g, const EnvLookup& env, LaunchOptions& o) {
  const std::string signals = g.has("signals_to_handle") ? g["signals_to_handle"] : "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  for (const std::string& s : split(signals, ',')) {
    if (s.empty()) continue;
    const int signo = parse_signal(s, g.flag("signals_to_handle"));
    if (signo == SIGKILL || signo == SIGSTOP || signo == SIGCHLD) {
      bad(g.flag("signals_to_handle"), "signals that can be caught and forwarded (not SIGKILL, SIGSTOP, SIGCHLD)", s);
    }
    if (std::find(o.signals_to_handle.begin(), o.signals_to_handle.end(), signo) == o.signals_to_handle.end()) {
      o.signals_to_handle.push_back(signo);
    }
  }
  if (g.has("shutdown_timeout")) {
    o.shutdown_timeout = parse_seconds(g.flag("shutdown_timeout"), trim(g["shutdown_timeout"]), true);
  } else if (auto v = env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"); v && !v->empty()) {
    o.shutdown_timeout = parse_seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", trim(*v), true);
  }
}

void resolve_workers(const Given& g, const EnvLookup& env, LaunchOptions& o) {
  resolve_supervision(g, env, o);
  resolve_output(g, env, o);
  resolve_invocation(g, env, o);
  resolve_signals(g, env, o);
}

// 3d. Combinations that cannot work, refused before anything starts.
void validate(LaunchOptions& o) {
  if (o.run_path && o.module) {
    throw ConfigError("--run_path and -m/--module cannot be combined: --run_path runs a script file, -m a module");
  }
  if (o.run_path) o.no_python = false;  // as torchrun: --run-path takes precedence over --no-python
  if (o.no_python && o.module) {
    throw ConfigError("--no_python and -m/--module cannot be combined: -m runs a Python module, --no_python runs "
                      "the program directly");
  }
  if (o.standalone && o.max_nodes > 1) {
    throw ConfigError("--standalone runs a single-node job, but --nnodes is " + std::to_string(o.max_nodes));
  }
  if (o.standalone) o.rdzv_backend = RdzvBackend::Static;  // one node, automatic port: the single-node path
  if (o.min_nodes != o.max_nodes && o.rdzv_backend == RdzvBackend::Static) {
    throw ConfigError("--nnodes " + std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes) +
                      ": node ranges need --rdzv_backend c10d with --rdzv_endpoint HOST:PORT (or etcd)");
  }
  if (o.rdzv_backend == RdzvBackend::Etcd && o.etcd.endpoints.empty()) {
    throw ConfigError("--rdzv_backend etcd needs --rdzv_endpoint HOST:PORT[,HOST:PORT...]: the etcd cluster's client "
                      "URLs (http:// or https:// optional)");
  }
  if (o.rdzv_backend == RdzvBackend::C10d && o.rdzv_endpoint_host.empty()) {
    throw ConfigError("--rdzv_backend c10d needs --rdzv_endpoint HOST[:PORT]: the store every node joins (a "
                      "ddprun-rendezvous daemon, or the ddprun on that host serves it)");
  }
  if (o.program.empty()) {
    throw ConfigError("missing the program to run: ddprun [options] PROGRAM [ARGS...] (see ddprun --help)");
  }
}

}  // namespace

LaunchOptions parse_options(const std::vector<std::string>& args, const EnvLookup& env, const HostFacts& host) {
  Given g = tokenize(args);
  LaunchOptions o;
  if (g.help || g.version) {
    o.help = g.help;
    o.version = g.version;
    return o;
  }
  apply_pet_fallbacks(g, env);
  apply_slurm(g, env);
  o.program = g.program;
  o.program_args = g.program_args;
  resolve_layout(g, host, o);
  resolve_rendezvous(g, env, o);
  resolve_workers(g, env, o);
  validate(o);
  return o;
}

std::string first_slurm_host(const std::string& nodelist) {
  const std::string list = trim(nodelist);
  size_t depth = 0, end = list.size();
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[') ++depth;
    if (list[i] == ']' && depth > 0) --depth;
    if (list[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  // Each bracket group ("[07-10,12]") contributes its first number.
  std::string host;
  const std::string first = list.substr(0, end);
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] != '[') {
      host.push_back(first[i]);
      continue;
    }
    const auto close = first.find(']', i);
    const std::string inside = first.substr(i + 1, close == std::string::npos ? std::string::npos : close - i - 1);
    host += inside.substr(0, inside.find_first_of("-,"));
    if (close == std::string::npos) break;
    i = close;
  }
  return host;
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

}  // namespace ddprun::launcher::cli
