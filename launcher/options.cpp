#include "launcher/options.hpp"

#include <sched.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/errors.hpp"
#include "rendezvous/job_keys.hpp"

namespace ddprun::launcher {
namespace {

struct FlagDef {
  const char* name;   // canonical spelling, with underscores
  const char* alias;  // short form or other name, or nullptr
  const char* dest;   // key in the parsed map; PET_<DEST> is the env fallback
  bool takes_value;
  const char* default_text;
  const char* help;
};

// Every flag ddprun accepts. Dashes and underscores are interchangeable after the leading "--".
constexpr FlagDef kFlags[] = {
    {"--nproc_per_node", nullptr, "nproc_per_node", true, "1",
     "workers on this node: a number, 'cpu' (one per CPU), 'gpu' (one per visible GPU) or 'auto' (GPUs if any, else CPUs)"},
    {"--nnodes", nullptr, "nnodes", true, "1", "number of nodes, N or MIN:MAX (ranges with --rdzv_backend c10d)"},
    {"--node_rank", nullptr, "node_rank", true, "0", "rank of this node, 0..nnodes-1 (static rendezvous)"},
    {"--master_addr", nullptr, "master_addr", true, "127.0.0.1",
     "address of node 0, where the store runs; MASTER_ADDR of the workers"},
    {"--master_port", nullptr, "master_port", true, "a kernel-picked free port on one node, 29500 on several",
     "port of the store on node 0"},
    {"--standalone", nullptr, "standalone", false, "off",
     "single-node job with an automatic store port and run id (ddprun's default anyway)"},
    {"--rdzv_backend", nullptr, "rdzv_backend", true, "static",
     "static (each node gives --node_rank) or c10d (nodes join --rdzv_endpoint without ranks; --nnodes MIN:MAX)"},
    {"--rdzv_endpoint", nullptr, "rdzv_endpoint", true, "(node 0 hosts it at master_addr:master_port)",
     "a ddprun-rendezvous daemon, host[:port] (port 29400 if omitted), to rendezvous through; many jobs can share one"},
    {"--rdzv_id", "--run_id", "rdzv_id", true, "none", "job id shared by all nodes; TORCHELASTIC_RUN_ID"},
    {"--rdzv_conf", nullptr, "rdzv_conf", true, "", "rendezvous settings k1=v1,k2=v2: join_timeout=600, last_call_timeout=30, keep_alive_interval=5, "
     "keep_alive_max_attempt=3"},
    {"--max_restarts", nullptr, "max_restarts", true, "0", "times the worker group is restarted after a failure"},
    {"--monitor_interval", nullptr, "monitor_interval", true, "0.1",
     "accepted for torchrun compatibility: worker exits are seen at once (SIGCHLD) and other nodes are "
     "checked every keep_alive_interval (--rdzv_conf)"},
    {"--role", nullptr, "role", true, "default", "worker role; ROLE_NAME"},
    {"--log_dir", nullptr, "log_dir", true, "(temporary directory)",
     "base directory for per-rank logs: LOG_DIR/RUN_ID_XXXX/attempt_K/LOCAL_RANK/{stdout,stderr}.log"},
    {"--redirects", "-r", "redirects", true, "0",
     "send worker output to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank '0:1,1:3'"},
    {"--tee", "-t", "tee", true, "0", "like --redirects, but also to the console"},
    {"--local_ranks_filter", nullptr, "local_ranks_filter", true, "(all)",
     "show only these local ranks on the console, e.g. '0' or '0,3' (log files keep everything)"},
    {"--no_python", nullptr, "no_python", false, "off", "run the program directly even if it ends in .py"},
    {"--module", "-m", "module", false, "off", "run the program as a Python module (python -m)"},
    {"--local_addr", nullptr, "local_addr", true, "(host name)", "address of this node that other nodes use"},
    {"--signals_to_handle", nullptr, "signals_to_handle", true, "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "signals forwarded to every worker; SIGTERM/SIGINT/SIGHUP/SIGQUIT also stop the job, others "
     "(e.g. SIGUSR1) are only forwarded"},
    {"--shutdown_timeout", nullptr, "shutdown_timeout", true, "30",
     "seconds between SIGTERM and SIGKILL when stopping workers"},
    {"--virtual_local_rank", nullptr, "virtual_local_rank", false, "off",
     "give each worker one GPU in CUDA_VISIBLE_DEVICES and LOCAL_RANK=0, so no rank touches another's GPU"},
    {"--log_line_prefix_template", nullptr, "log_line_prefix_template", true, "[rank${rank}]: ",
     "prefix of each console line; ${rank}, ${local_rank}, ${role_name}, ${host} are replaced"},
    {"--start_method", nullptr, "start_method", true, "spawn", "accepted for torchrun compatibility; ignored"},
};

const FlagDef* find_flag(const std::string& spelled) {
  std::string norm = spelled;
  if (norm.rfind("--", 0) == 0) std::replace(norm.begin() + 2, norm.end(), '-', '_');
  for (const FlagDef& f : kFlags) {
    if (norm == f.name || (f.alias && norm == f.alias)) return &f;
  }
  return nullptr;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(trim(item));
  return out;
}

[[noreturn]] void bad(const std::string& flag, const std::string& expected, const std::string& got) {
  throw ConfigError(flag + ": expected " + expected + ", got '" + got + "'");
}

long long parse_int(const std::string& flag, const std::string& text, long long lo, long long hi,
                    const std::string& expected) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v >= lo && v <= hi) return v;
  } catch (const std::exception&) {
  }
  bad(flag, expected, text);
}

std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& text, bool allow_zero) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && (v > 0 || (allow_zero && v == 0)) && v < 1e7) {
      return std::chrono::milliseconds(static_cast<long long>(v * 1000));
    }
  } catch (const std::exception&) {
  }
  bad(flag, allow_zero ? "a number of seconds >= 0" : "a number of seconds > 0", text);
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

}  // namespace

int parse_signal(const std::string& text, const std::string& flag) {
  const std::string t = upper(trim(text));
  if (!t.empty() && std::all_of(t.begin(), t.end(), ::isdigit)) {
    return static_cast<int>(parse_int(flag, t, 1, 64, "a signal name such as SIGUSR1"));
  }
  const std::string name = t.rfind("SIG", 0) == 0 ? t.substr(3) : t;
  for (int s = 1; s < 32; ++s) {
    const char* abbrev = sigabbrev_np(s);
    if (abbrev && name == abbrev) return s;
  }
  bad(flag, "signal names such as SIGTERM,SIGUSR1", text);
}

std::string signal_name(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

LaunchOptions parse_options(const std::vector<std::string>& args, const EnvLookup& env, const HostFacts& host) {
  std::map<std::string, std::string> given;  // dest -> value
  std::map<std::string, std::string> spelled;  // dest -> the flag as the user wrote it (for errors)
  LaunchOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    }
    if (a == "--version") {
      o.version = true;
      return o;
    }
    if (a.empty() || a[0] != '-' || a == "-") break;  // the program
    std::string name = a, value;
    bool inline_value = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      name = a.substr(0, a.find('='));
      value = a.substr(a.find('=') + 1);
      inline_value = true;
    } else if (a.size() > 2 && a[1] != '-' && find_flag(a.substr(0, 2)) && find_flag(a.substr(0, 2))->takes_value) {
      name = a.substr(0, 2);  // -r3
      value = a.substr(2);
      inline_value = true;
    }
    const FlagDef* f = find_flag(name);
    if (!f) throw ConfigError("unknown option '" + name + "' (see ddprun --help for the list)");
    if (f->takes_value) {
      if (!inline_value) {
        if (i + 1 >= args.size()) throw ConfigError(name + " needs a value (" + f->help + ")");
        value = args[++i];
      }
    } else {
      if (inline_value) throw ConfigError(name + " takes no value, got '" + value + "'");
      value = "1";
    }
    given[f->dest] = value;
    spelled[f->dest] = name;
  }
  if (i < args.size()) {
    o.program = args[i];
    o.program_args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  }

  // PET_<DEST> fallbacks, as torchrun reads them (Kubeflow's PyTorchJob sets these).
  for (const FlagDef& f : kFlags) {
    if (given.count(f.dest)) continue;
    const std::string var = "PET_" + upper(f.dest);
    if (auto v = env(var); v && !v->empty()) {
      if (!f.takes_value) {
        // torchrun's check_env: a non-zero integer means on.
        try {
          if (std::stoll(*v) == 0) continue;
        } catch (const std::exception&) {
          throw ConfigError(var + ": expected an integer (0 off, non-zero on), got '" + *v + "'");
        }
        given[f.dest] = "1";
      } else {
        given[f.dest] = *v;
      }
      spelled[f.dest] = var;
    }
  }
  // Under Slurm (srun ddprun ...), the job's layout comes from its environment unless given.
  const auto slurm_job = env("SLURM_JOB_ID"), slurm_nodes = env("SLURM_NNODES"), slurm_node = env("SLURM_NODEID"),
             slurm_list = env("SLURM_JOB_NODELIST");
  if (slurm_job && slurm_nodes && slurm_node && slurm_list && !given.count("nnodes") && !given.count("node_rank") &&
      !given.count("master_addr")) {
    given["nnodes"] = *slurm_nodes;
    spelled["nnodes"] = "SLURM_NNODES";
    given["node_rank"] = *slurm_node;
    spelled["node_rank"] = "SLURM_NODEID";
    given["master_addr"] = first_slurm_host(*slurm_list);
    spelled["master_addr"] = "SLURM_JOB_NODELIST";
    if (!given.count("master_port")) {
      // The same on every node of the job, and below Linux's ephemeral port range.
      const long long id = parse_int("SLURM_JOB_ID", trim(*slurm_job), 0, (1LL << 62), "a job number");
      given["master_port"] = std::to_string(20000 + id % 12000);
      spelled["master_port"] = "SLURM_JOB_ID";
    }
    if (!given.count("rdzv_id")) {
      given["rdzv_id"] = "slurm-" + trim(*slurm_job);
      spelled["rdzv_id"] = "SLURM_JOB_ID";
    }
    o.from_slurm = true;
  }
  auto has = [&](const char* d) { return given.count(d) != 0; };
  auto flag = [&](const char* d) { return spelled.count(d) ? spelled[d] : std::string("--") + d; };

  if (has("nproc_per_node")) {
    const std::string v = trim(given["nproc_per_node"]);
    o.nproc_spec = v;
    if (v == "cpu") {
      o.nproc_per_node = host.cpu_count;
    } else if (v == "gpu") {
      if (host.gpu_count == 0) {
        throw ConfigError(flag("nproc_per_node") + " gpu: no GPU is visible (check CUDA_VISIBLE_DEVICES and "
                          "/dev/nvidia*); use a number or 'cpu'");
      }
      o.nproc_per_node = host.gpu_count;
    } else if (v == "auto") {
      o.nproc_per_node = host.gpu_count > 0 ? host.gpu_count : host.cpu_count;
    } else {
      o.nproc_per_node = static_cast<int>(
          parse_int(flag("nproc_per_node"), v, 1, 1 << 16, "a positive number, 'auto', 'cpu' or 'gpu'"));
    }
  }
  if (has("nnodes")) {
    const std::string v = trim(given["nnodes"]);
    const std::string expected = "N or MIN:MAX with 0 < MIN <= MAX";
    const auto colon = v.find(':');
    if (colon == std::string::npos) {
      o.min_nodes = o.max_nodes = static_cast<int>(parse_int(flag("nnodes"), v, 1, 1 << 20, expected));
    } else {
      o.min_nodes = static_cast<int>(parse_int(flag("nnodes"), trim(v.substr(0, colon)), 1, 1 << 20, expected));
      o.max_nodes = static_cast<int>(parse_int(flag("nnodes"), trim(v.substr(colon + 1)), 1, 1 << 20, expected));
      if (o.min_nodes > o.max_nodes) bad(flag("nnodes"), expected, v);
    }
  }
  o.node_rank_given = has("node_rank");
  if (has("node_rank")) {
    o.node_rank = static_cast<int>(parse_int(flag("node_rank"), trim(given["node_rank"]), 0, o.max_nodes - 1,
                                             "a node rank from 0 to " + std::to_string(o.max_nodes - 1) +
                                                 " (--nnodes is " + std::to_string(o.max_nodes) + ")"));
  }
  if (has("master_addr")) {
    o.master_addr = trim(given["master_addr"]);
    // torchrun accepts IPv6 in brackets.
    if (o.master_addr.size() > 2 && o.master_addr.front() == '[' && o.master_addr.back() == ']') {
      o.master_addr = o.master_addr.substr(1, o.master_addr.size() - 2);
    }
    if (o.master_addr.empty()) bad(flag("master_addr"), "a host name or address", given["master_addr"]);
  }
  if (has("master_port")) {
    const auto port = parse_int(flag("master_port"), trim(given["master_port"]), 0, 65535, "a port from 0 to 65535");
    if (port != 0) o.master_port = static_cast<uint16_t>(port);
  }
  o.standalone = has("standalone");
  if (has("rdzv_backend")) {
    o.rdzv_backend = trim(given["rdzv_backend"]);
    if (o.rdzv_backend != "static" && o.rdzv_backend != "c10d") {
      throw ConfigError(flag("rdzv_backend") + ": expected 'static' (fixed --node_rank per node) or 'c10d' "
                        "(nodes join --rdzv_endpoint without ranks, --nnodes MIN:MAX), got '" + o.rdzv_backend + "'");
    }
  }
  if (has("rdzv_endpoint") && !trim(given["rdzv_endpoint"]).empty()) {
    // host, host:port, [v6], [v6]:port
    o.rdzv_endpoint = trim(given["rdzv_endpoint"]);
    std::string host = o.rdzv_endpoint, port;
    if (host.front() == '[') {
      const auto close = host.find(']');
      if (close == std::string::npos) bad(flag("rdzv_endpoint"), "host[:port] or [ipv6]:port", o.rdzv_endpoint);
      if (close + 1 < host.size()) {
        if (host[close + 1] != ':') bad(flag("rdzv_endpoint"), "host[:port] or [ipv6]:port", o.rdzv_endpoint);
        port = host.substr(close + 2);
      }
      host = host.substr(1, close - 1);
    } else if (std::count(host.begin(), host.end(), ':') == 1) {
      port = host.substr(host.find(':') + 1);
      host = host.substr(0, host.find(':'));
    }
    if (host.empty()) bad(flag("rdzv_endpoint"), "host[:port] or [ipv6]:port", o.rdzv_endpoint);
    o.rdzv_endpoint_host = host;
    if (!port.empty()) {
      o.rdzv_endpoint_port =
          static_cast<uint16_t>(parse_int(flag("rdzv_endpoint"), port, 1, 65535, "host[:port] with a port from 1 to 65535"));
    }
  }
  if (has("rdzv_id")) {
    o.run_id = trim(given["rdzv_id"]);
    std::string why;
    if (!rdzv::jobs::valid_run_id(o.run_id, &why)) {
      throw ConfigError(flag("rdzv_id") + ": '" + o.run_id + "' cannot name a job: " + why);
    }
  }
  if (has("rdzv_conf") && !trim(given["rdzv_conf"]).empty()) {
    for (const std::string& kv : split(given["rdzv_conf"], ',')) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) bad(flag("rdzv_conf"), "key=value pairs separated by commas", kv);
      o.rdzv_conf[trim(kv.substr(0, eq))] = trim(kv.substr(eq + 1));
    }
    for (const auto& [k, v] : o.rdzv_conf) {
      if (k == "join_timeout" || k == "timeout") {
        o.join_timeout = parse_seconds(flag("rdzv_conf") + " " + k, v, false);
      } else if (k == "keep_alive_interval") {
        o.keep_alive_interval = parse_seconds(flag("rdzv_conf") + " " + k, v, false);
      } else if (k == "last_call_timeout") {
        o.last_call_timeout = parse_seconds(flag("rdzv_conf") + " " + k, v, false);
      } else if (k == "keep_alive_max_attempt") {
        o.keep_alive_max_attempt = static_cast<int>(parse_int(flag("rdzv_conf") + " " + k, v, 1, 1000, "a count >= 1"));
      } else if (k != "close_timeout" && k != "read_timeout" && k != "is_host") {
        throw ConfigError(flag("rdzv_conf") + ": unknown key '" + k +
                          "' (known: join_timeout, last_call_timeout, keep_alive_interval, keep_alive_max_attempt)");
      }
    }
  }
  if (has("max_restarts")) {
    o.max_restarts = static_cast<int>(
        parse_int(flag("max_restarts"), trim(given["max_restarts"]), 0, 1 << 20, "a whole number >= 0"));
  }
  if (has("monitor_interval")) o.monitor_interval = parse_seconds(flag("monitor_interval"), trim(given["monitor_interval"]), false);
  if (has("role")) {
    o.role = trim(given["role"]);
    if (o.role.empty()) bad(flag("role"), "a non-empty role name", given["role"]);
  }
  if (has("log_dir")) o.log_dir = given["log_dir"];
  if (has("redirects")) o.redirects = parse_streams(flag("redirects"), given["redirects"]);
  if (has("tee")) o.tee = parse_streams(flag("tee"), given["tee"]);
  if (has("local_ranks_filter") && !trim(given["local_ranks_filter"]).empty()) {
    std::set<int> ranks;
    for (const std::string& r : split(given["local_ranks_filter"], ',')) {
      ranks.insert(static_cast<int>(parse_int(flag("local_ranks_filter"), r, 0, 1 << 20,
                                              "comma-separated local ranks such as '0' or '0,2'")));
    }
    o.local_ranks_filter = std::move(ranks);
  }
  o.no_python = has("no_python");
  o.module = has("module");
  if (o.no_python && o.module) {
    throw ConfigError("--no_python and -m/--module cannot be combined: -m runs a Python module, --no_python runs "
                      "the program directly");
  }
  if (has("local_addr")) o.local_addr = trim(given["local_addr"]);
  const std::string signals = has("signals_to_handle") ? given["signals_to_handle"] : "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  for (const std::string& s : split(signals, ',')) {
    if (s.empty()) continue;
    const int signo = parse_signal(s, flag("signals_to_handle"));
    if (signo == SIGKILL || signo == SIGSTOP || signo == SIGCHLD) {
      bad(flag("signals_to_handle"), "signals that can be caught and forwarded (not SIGKILL, SIGSTOP, SIGCHLD)", s);
    }
    if (std::find(o.signals_to_handle.begin(), o.signals_to_handle.end(), signo) == o.signals_to_handle.end()) {
      o.signals_to_handle.push_back(signo);
    }
  }
  if (has("shutdown_timeout")) o.shutdown_timeout = parse_seconds(flag("shutdown_timeout"), trim(given["shutdown_timeout"]), true);
  else if (auto v = env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"); v && !v->empty()) {
    o.shutdown_timeout = parse_seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", trim(*v), true);
  }
  o.virtual_local_rank = has("virtual_local_rank");
  if (has("log_line_prefix_template")) o.log_line_prefix = given["log_line_prefix_template"];
  else if (auto v = env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); v) o.log_line_prefix = *v;

  if (o.standalone && o.max_nodes > 1) {
    throw ConfigError("--standalone runs a single-node job, but --nnodes is " + std::to_string(o.max_nodes));
  }
  if (o.standalone) o.rdzv_backend = "static";  // one node, automatic port: the single-node path
  if (o.min_nodes != o.max_nodes && o.rdzv_backend != "c10d") {
    throw ConfigError("--nnodes " + std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes) +
                      ": node ranges need --rdzv_backend c10d with --rdzv_endpoint HOST:PORT");
  }
  if (o.rdzv_backend == "c10d" && o.rdzv_endpoint_host.empty()) {
    throw ConfigError("--rdzv_backend c10d needs --rdzv_endpoint HOST[:PORT]: the store every node joins (a "
                      "ddprun-rendezvous daemon, or the ddprun on that host serves it)");
  }
  if (o.program.empty()) {
    throw ConfigError("missing the program to run: ddprun [options] PROGRAM [ARGS...] (see ddprun --help)");
  }
  return o;
}

std::string usage_text() {
  std::ostringstream out;
  out << "usage: ddprun [options] PROGRAM [ARGS...]\n\n"
         "Starts nproc_per_node workers of PROGRAM on this node with torchrun's environment (RANK, LOCAL_RANK,\n"
         "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), hosts their rendezvous store, supervises them, and reports\n"
         "which rank failed and why. A PROGRAM ending in .py runs under $PYTHON_EXEC (default python3) -u;\n"
         "anything else is executed directly. '${local_rank}' in ARGS is replaced per worker.\n\n"
         "options (dashes and underscores are interchangeable; each also reads PET_<NAME> from the environment):\n";
  for (const FlagDef& f : kFlags) {
    std::string names = f.alias ? std::string(f.alias) + ", " + f.name : std::string(f.name);
    if (f.takes_value) names += " VALUE";
    out << "  " << names << "\n      " << f.help << " (default: " << f.default_text << ")\n";
  }
  out << "  -h, --help\n      show this help\n  --version\n      print the version\n\n"
         "exit status: 0 when every worker succeeded; the root-cause worker's exit code (128+N if it died of signal\n"
         "N) when one failed; 2 for a bad command line; 1 when ddprun itself could not run the job.\n";
  return out.str();
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

HostFacts detect_host(const EnvLookup& env) {
  HostFacts h;
  cpu_set_t set;
  CPU_ZERO(&set);
  h.cpu_count = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  if (auto cvd = env("CUDA_VISIBLE_DEVICES")) {
    for (const std::string& d : split(*cvd, ',')) {
      if (d.empty() || d == "-1" || d == "NoDevFiles") break;
      ++h.gpu_count;
    }
    return h;
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("nvidia", 0) == 0 && n.size() > 6 && std::all_of(n.begin() + 6, n.end(), ::isdigit)) ++h.gpu_count;
  }
  return h;
}

}  // namespace ddprun::launcher
