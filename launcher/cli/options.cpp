#include "launcher/cli/options.hpp"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <cstring>  // sigabbrev_np

#include "common/command_line.hpp"
#include "common/errors.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options_parse.hpp"

namespace ddprun::launcher::cli {

namespace {

using namespace options_detail;

}  // namespace

namespace options_detail {

StreamSelection parse_streams(const std::string& flag, const std::string& text) {
  const std::string expected = "0 (none), 1 (stdout), 2 (stderr), 3 (both) or per local rank like '0:1,1:3'";
  StreamSelection sel;
  if (text.find(':') == std::string::npos) {
    sel.all = static_cast<int>(parse_whole(flag, trim(text), 0, 3, expected));
    return sel;
  }
  // torchrun's pattern, (N:S,)*N:S: no empty item, a trailing comma included.
  if (trim(text).back() == ',') bad_value(flag, expected, text);
  for (const std::string& item : split(text, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) bad_value(flag, expected, text);
    const int lr = static_cast<int>(parse_whole(flag, trim(item.substr(0, colon)), 0, 1 << 20, expected));
    sel.per_rank[lr] = static_cast<int>(parse_whole(flag, trim(item.substr(colon + 1)), 0, 3, expected));
  }
  return sel;
}

std::string streams_text(const StreamSelection& s) {
  std::string out;
  for (const auto& [local_rank, streams] : s.per_rank) {
    out += (out.empty() ? "" : ",") + std::to_string(local_rank) + ":" + std::to_string(streams);
  }
  return out.empty() ? std::to_string(s.all) : out;
}

// "a,b,,c" -> {"a", "b,c"}: torchrun's filter lists, where ",," is a comma inside a filter. Empty
// filters (which every line contains) are dropped.
std::vector<std::string> parse_filters(const std::string& flag, const std::string& text) {
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
  if (out.empty()) bad_value(flag, "substrings separated by commas (',,' for a comma inside one)", text);
  return out;
}

// --preload's modules: dotted Python names, each checked, so a typo is an error before any import.
std::vector<std::string> parse_preload(const std::string& where, const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& m : split(text, ',')) {
    if (m.empty()) continue;
    bool ok = !std::isdigit(static_cast<unsigned char>(m.front())) && m.front() != '.' && m.back() != '.' &&
              m.find("..") == std::string::npos;
    for (char c : m) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.');
    if (!ok) bad_value(where, "Python module names separated by commas, such as torch,numpy", m);
    out.push_back(m);
  }
  return out;
}

std::string signals_text(const std::vector<int>& signals) {
  std::string out;
  for (int s : signals) {
    const char* abbrev = sigabbrev_np(s);
    out += (out.empty() ? "" : ",") + (abbrev ? "SIG" + std::string(abbrev) : std::to_string(s));
  }
  return out;
}

void apply_signals(const FlagInput& in, LaunchOptions& o) {
  o.signals_to_handle.clear();
  for (const std::string& s : split(in.text, ',')) {
    if (s.empty()) continue;
    const int signo = parse_signal(s, in.flag);
    if (signo == SIGKILL || signo == SIGSTOP || signo == SIGCHLD) {
      bad_value(in.flag, "signals that can be caught and forwarded (not SIGKILL, SIGSTOP, SIGCHLD)", s);
    }
    if (std::find(o.signals_to_handle.begin(), o.signals_to_handle.end(), signo) == o.signals_to_handle.end()) {
      o.signals_to_handle.push_back(signo);
    }
  }
}

// PyTorch's "cuda" devices on this host and whose they are: NVIDIA's when any is there (or
// CUDA_VISIBLE_DEVICES names some and no AMD GPU is), else AMD's.
std::pair<int, GpuVendor> cuda_devices(const HostFacts& host) {
  if (host.gpu_count > 0 && (host.nvidia_devices || host.amd_count == 0)) return {host.gpu_count, GpuVendor::Nvidia};
  if (host.amd_count > 0) return {host.amd_count, GpuVendor::Amd};
  return {0, GpuVendor::None};
}

void apply_nproc_per_node(const FlagInput& in, LaunchOptions& o) {
  const std::string v = trim(in.text);
  const HostFacts& host = in.host;
  o.nproc_spec = v;
  if (v == "cpu") {
    o.nproc_per_node = host.cpu_count;
  } else if (v == "xpu") {
    if (host.xpu_count == 0) {
      throw ConfigError(in.flag +
                        " xpu: no Intel GPU is visible (no render node of an Intel GPU under "
                        "/sys/class/drm, or ZE_AFFINITY_MASK lists none)");
    }
    o.nproc_per_node = host.xpu_count;
    o.gpu_vendor = GpuVendor::Intel;
  } else if (v == "gpu" || v == "cuda") {
    // PyTorch's "cuda" devices: NVIDIA's, or AMD's under ROCm.
    const auto [count, vendor] = cuda_devices(host);
    if (count == 0) {
      throw ConfigError(in.flag + " " + v +
                        ": no GPU is visible (no /dev/nvidia* device or AMD GPU in the KFD "
                        "topology, or CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES lists "
                        "none); use a number, 'cpu' or 'xpu'");
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
        parse_whole(in.flag, v, 1, 1 << 16, "a positive number, 'auto', 'cpu', 'gpu', 'cuda' or 'xpu'"));
  }
}

void apply_nnodes(const FlagInput& in, LaunchOptions& o) {
  const std::string v = trim(in.text);
  const std::string expected = "N or MIN:MAX with 0 < MIN <= MAX";
  const auto colon = v.find(':');
  if (colon == std::string::npos) {
    o.min_nodes = o.max_nodes = static_cast<int>(parse_whole(in.flag, v, 1, 1 << 20, expected));
    return;
  }
  o.min_nodes = static_cast<int>(parse_whole(in.flag, trim(v.substr(0, colon)), 1, 1 << 20, expected));
  o.max_nodes = static_cast<int>(parse_whole(in.flag, trim(v.substr(colon + 1)), 1, 1 << 20, expected));
  if (o.min_nodes > o.max_nodes) bad_value(in.flag, expected, v);
}

}  // namespace options_detail

namespace {

using namespace options_detail;

// 1. argv -> flags and the program; stops at the first argument that is not a flag (or "--").
Given tokenize(const std::vector<std::string>& args) {
  using command_line::FlagShape;
  using command_line::Takes;
  Given g;
  command_line::StandardFlags standard;
  auto exact = [](const std::string& name) -> std::optional<FlagShape> {
    if (auto shape = command_line::StandardFlags::shape(name)) return shape;
    const FlagDef* f = find_flag(name);
    if (!f) return std::nullopt;
    return FlagShape{f->takes_value()    ? Takes::Value
                     : f->optional_value ? Takes::InlineValue
                                         : Takes::Nothing,
                     f->help};
  };
  auto lookup = [&](const std::string& name) -> std::optional<FlagShape> {
    if (auto shape = exact(name)) return shape;
    const std::string full = abbreviated_flag(name);  // as argparse: "--nproc" for --nproc_per_node
    if (full.empty()) return std::nullopt;
    auto shape = exact(full);
    shape->name = full;
    return shape;
  };
  auto on_flag = [&](const std::string& name, const std::optional<std::string>& value) {
    if (!standard.take(name, value)) g.set(flag_dest(*find_flag(name)), value.value_or("1"), name);
    return standard.go_on();
  };
  const size_t rest = command_line::walk(args, 0, lookup, on_flag, " (see ddprun --help for the list)");
  g.help = standard.help;
  g.help_markdown = standard.markdown;
  g.version = standard.version;
  if (g.help || g.version || rest >= args.size()) return g;
  g.program = args[rest];
  g.program_args.assign(args.begin() + static_cast<long>(rest) + 1, args.end());
  return g;
}

// 2a. For every flag not given: PET_<DEST>, as torchrun reads them (Kubeflow's PyTorchJob sets these),
// then the other variable that stands for the flag, if it has one (DDPRUN_REPORT_FILE).
void apply_environment_fallbacks(Given& g, const EnvLookup& env) {
  for (const FlagDef& f : flag_table()) {
    const std::string dest = flag_dest(f);
    if (g.has(dest)) continue;
    const std::string var = "PET_" + upper(dest);
    if (auto v = env(var); v && !v->empty()) {
      if (f.takes_value()) {
        g.set(dest, *v, var);
        continue;
      }
      // torchrun's check_env: a non-zero integer means on.
      const auto on = to_int(trim(*v));
      if (!on) throw ConfigError(var + ": expected an integer (0 off, non-zero on), got '" + *v + "'");
      if (*on != 0) g.set(dest, "1", var);
      continue;
    }
    if (f.env == nullptr) continue;
    if (auto v = env(f.env); v && !trim(*v).empty()) g.set(dest, *v, f.env);
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
    const long long id = parse_whole("SLURM_JOB_ID", trim(*job), 0, (1LL << 62), "a job number");
    g.set("master_port", std::to_string(20000 + id % 12000), "SLURM_JOB_ID");
  }
  if (!g.has("rdzv_id")) g.set("rdzv_id", "slurm-" + trim(*job), "SLURM_JOB_ID");
}

// 3a. Settings that only the environment gives (no flag stands for them).
void apply_environment_settings(const EnvLookup& env, LaunchOptions& o) {
  if (auto v = env("DDPRUN_PROGRESS_INTERVAL"); v && !trim(*v).empty()) {
    o.progress_interval = parse_seconds("DDPRUN_PROGRESS_INTERVAL", trim(*v), false);
  }
  if (auto v = env("DDPRUN_STEP_RATES_PERIOD"); v && !trim(*v).empty()) {
    const auto period = to_double(trim(*v));
    if (!period || *period < 0.5 || *period > 3600) {
      bad_value("DDPRUN_STEP_RATES_PERIOD", "seconds from 0.5 to 3600 (default 10)", *v);
    }
    o.step_rates_period = std::chrono::milliseconds(static_cast<int64_t>(*period * 1000));
  }
  // As torchrun: on when it is "1".
  if (auto v = env("TORCHELASTIC_ENABLE_FILE_TIMER")) o.file_timer = trim(*v) == "1";
  if (auto v = env("TORCHELASTIC_TIMER_FILE")) o.timer_file = trim(*v);
  if (auto v = env("TORCHELASTIC_ERROR_FILE"); v && !trim(*v).empty()) o.launcher_error_file = trim(*v);
  if (auto v = env("DDPRUN_TOPOLOGY_ROOT"); v && !trim(*v).empty()) o.topology_root = trim(*v);
  // --rdzv_conf token_file, applied later, wins.
  if (auto v = env("DDPRUN_TOKEN_FILE"); v && !v->empty()) o.token_file = *v;
}

// 3b. Each flag given, through its row, in table order.
void apply_flags(const Given& g, const HostFacts& host, LaunchOptions& o) {
  for (const FlagDef& f : flag_table()) {
    const std::string dest = flag_dest(f);
    if (g.has(dest)) f.set.apply(FlagInput{{g.flag(dest), g[dest]}, host}, o);
  }
  if (o.gpu_vendor == GpuVendor::None) {  // a number of workers: the GPUs this host has, if any
    const auto [count, vendor] = cuda_devices(host);
    o.gpu_vendor = count > 0 ? vendor : host.xpu_count > 0 ? GpuVendor::Intel : GpuVendor::None;
  }
}

// 4. Combinations that cannot work, refused before anything starts.
void validate(LaunchOptions& o) {
  if (o.local_rank_arg != LocalRankArg::None && o.use_env) {
    throw ConfigError(
        "--local_rank_arg and --use_env contradict each other: --use_env is torch.distributed.launch's "
        "way of saying 'no --local_rank argument'; keep one");
  }
  if (o.run_path && o.module) {
    throw ConfigError("--run_path and -m/--module cannot be combined: --run_path runs a script file, -m a module");
  }
  if (o.run_path) o.no_python = false;  // as torchrun: --run-path takes precedence over --no-python
  if (o.no_python && o.module) {
    throw ConfigError(
        "--no_python and -m/--module cannot be combined: -m runs a Python module, --no_python runs "
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
    throw ConfigError(
        "--rdzv_backend etcd needs --rdzv_endpoint HOST:PORT[,HOST:PORT...]: the etcd cluster's client "
        "URLs (http:// or https:// optional)");
  }
  if (o.rdzv_backend == RdzvBackend::C10d && o.rdzv_endpoint_host.empty()) {
    throw ConfigError(
        "--rdzv_backend c10d needs --rdzv_endpoint HOST[:PORT]: the store every node joins (a "
        "ddprun-rendezvous daemon, or the ddprun on that host serves it)");
  }
  if (o.replica_group && o.rdzv_backend == RdzvBackend::Static) {
    throw ConfigError(
        "--replica_group needs --rdzv_backend c10d --rdzv_endpoint HOST:PORT (a ddprun-rendezvous daemon) or "
        "--rdzv_backend etcd: where the job's quorum lives, outside every group");
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
    o.help_markdown = g.help_markdown;
    o.version = g.version;
    return o;
  }
  apply_environment_fallbacks(g, env);
  apply_slurm(g, env);
  o.program = g.program;
  o.program_args = g.program_args;
  apply_environment_settings(env, o);
  apply_flags(g, host, o);
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
