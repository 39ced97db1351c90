#include "launcher/cli/flags.hpp"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <sstream>

#include "common/command_line.hpp"
#include "common/errors.hpp"

namespace ddprun::launcher::cli {
namespace {

// Every flag ddprun accepts. Dashes and underscores are interchangeable after the leading "--".
constexpr FlagDef kFlagTable[] = {
    {"--nproc_per_node", nullptr, "nproc_per_node", true, "1",
     "workers on this node: a number, 'cpu' (one per CPU), 'gpu' or 'cuda' (one per visible NVIDIA GPU, or AMD GPU "
     "under ROCm), 'xpu' (one per visible Intel GPU) or 'auto' (GPUs if any, else CPUs)"},
    {"--nnodes", nullptr, "nnodes", true, "1", "number of nodes, N or MIN:MAX (ranges with --rdzv_backend c10d or etcd)"},
    {"--node_rank", nullptr, "node_rank", true, "0", "rank of this node, 0..nnodes-1 (static rendezvous)"},
    {"--master_addr", nullptr, "master_addr", true, "127.0.0.1",
     "address of node 0, where the store runs; MASTER_ADDR of the workers"},
    {"--master_port", nullptr, "master_port", true, "a kernel-picked free port on one node, 29500 on several",
     "port of the store on node 0"},
    {"--standalone", nullptr, "standalone", false, "off",
     "single-node job with an automatic store port and run id (ddprun's default anyway)"},
    {"--rdzv_backend", nullptr, "rdzv_backend", true, "static",
     "static (each node gives --node_rank), c10d (nodes join --rdzv_endpoint without ranks; --nnodes MIN:MAX) or "
     "etcd (the same through an etcd v3 cluster: no single point of failure)"},
    {"--rdzv_endpoint", nullptr, "rdzv_endpoint", true, "(node 0 hosts it at master_addr:master_port)",
     "a ddprun-rendezvous daemon, host[:port] (port 29400 if omitted), to rendezvous through; many jobs can share "
     "one. With etcd: the cluster's client URLs, host:port[,host:port...] (http:// or https:// optional)"},
    {"--rdzv_id", "--run_id", "rdzv_id", true, "none", "job id shared by all nodes; TORCHELASTIC_RUN_ID"},
    {"--rdzv_conf", nullptr, "rdzv_conf", true, "", "rendezvous settings k1=v1,k2=v2: join_timeout=600, last_call_timeout=30, keep_alive_interval=5, "
     "keep_alive_max_attempt=3, token_file=PATH (the rendezvous secret, or this job's token; also "
     "DDPRUN_TOKEN_FILE). With etcd: key_prefix=/ddprun/, lease_ttl=10, etcd_user=NAME, etcd_password_file=PATH, "
     "etcd_ca_file=PATH (https), etcd_cert_file=PATH, etcd_key_file=PATH (client certificate), protocol=http|https"},
    {"--max_restarts", nullptr, "max_restarts", true, "0", "times the worker group is restarted after a failure or a hang"},
    {"--hang_timeout", nullptr, "hang_timeout", true, "0 (off)",
     "seconds without progress from any rank after which the job is hung: every rank's stacks are captured and "
     "reported, then the job is stopped (exit code 124) or restarted (--max_restarts)"},
    {"--straggler_factor", nullptr, "straggler_factor", true, "1.5",
     "warn when a rank's compute time per step stays above this multiple of the median rank's (0: never)"},
    {"--monitor_interval", nullptr, "monitor_interval", true, "0.1",
     "accepted for torchrun compatibility: worker exits are seen at once (SIGCHLD) and other nodes are "
     "checked every keep_alive_interval (--rdzv_conf)"},
    {"--role", nullptr, "role", true, "default", "worker role; ROLE_NAME"},
    {"--log_dir", nullptr, "log_dir", true, "(temporary directory)",
     "base directory for per-rank logs: LOG_DIR/RUN_ID_XXXX/attempt_K/LOCAL_RANK/{stdout,stderr}.log"},
    {"--report_file", nullptr, "report_file", true, "(none; DDPRUN_REPORT_FILE)",
     "write how the job ended as one JSON document to this path at the end of every job (schema "
     "ddprun-report/1 in docs/guide.md); {host} in the path is this host's name"},
    {"--redirects", "-r", "redirects", true, "0",
     "send worker output to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank '0:1,1:3'"},
    {"--tee", "-t", "tee", true, "0", "like --redirects, but also to the console"},
    {"--local_ranks_filter", nullptr, "local_ranks_filter", true, "(all)",
     "show only these local ranks on the console, e.g. '0' or '0,3' (log files keep everything)"},
    {"--duplicate_stdout_filters", nullptr, "duplicate_stdout_filters", true, "(none)",
     "lines of the workers' stdout containing one of these comma-separated substrings (',,' for a comma) also go "
     "to filtered_stdout.log in the attempt's log directory, prefixed as on the console"},
    {"--duplicate_stderr_filters", nullptr, "duplicate_stderr_filters", true, "(none)",
     "the same for stderr, into filtered_stderr.log"},
    {"--merge_lines", nullptr, "merge_lines", false, "off",
     "print a console line that several ranks write within 1 second once, prefixed with all of them "
     "('[rank0-7]: ...'); --merge_lines=SECONDS sets the window (each rank's lines keep their order; log files "
     "keep every line)",
     true},
    {"--no_python", nullptr, "no_python", false, "off", "run the program directly even if it ends in .py"},
    {"--module", "-m", "module", false, "off", "run the program as a Python module (python -m)"},
    {"--run_path", nullptr, "run_path", false, "off",
     "run the program as a Python script whatever its name (torchrun's runpy.run_path; before --no_python)"},
    {"--preload", nullptr, "preload", true, "(none; DDPRUN_PRELOAD)",
     "Python modules (comma-separated, e.g. torch) one interpreter per node imports once; each Python worker is "
     "then forked from it instead of started anew, and restarts fork again without importing"},
    {"--local_rank_arg", nullptr, "local_rank_arg", false, "off",
     "pass --local_rank=N as the program's first argument, as torch.distributed.launch 1.x did (scripts that read "
     "--local_rank from argv run unchanged); --local_rank_arg=dash passes --local-rank=N, as 2.x does",
     true},
    {"--use_env", nullptr, "use_env", false, "off",
     "accepted for torch.distributed.launch compatibility: the workers always get LOCAL_RANK in their environment"},
    {"--local_addr", nullptr, "local_addr", true, "(fully qualified host name)", "address of this node that other nodes use"},
    {"--signals_to_handle", nullptr, "signals_to_handle", true, "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "signals forwarded to every worker; SIGTERM/SIGINT/SIGHUP/SIGQUIT also stop the job, others "
     "(e.g. SIGUSR1) are only forwarded"},
    {"--shutdown_timeout", nullptr, "shutdown_timeout", true, "30",
     "seconds between SIGTERM and SIGKILL when stopping workers"},
    {"--virtual_local_rank", nullptr, "virtual_local_rank", false, "off",
     "give each worker one GPU (CUDA_VISIBLE_DEVICES; HIP_VISIBLE_DEVICES on AMD, ZE_AFFINITY_MASK on Intel) and "
     "LOCAL_RANK=0, so no rank touches another's GPU"},
    {"--numa_binding", nullptr, "numa_binding", true, "(off)",
     "bind each local rank's CPUs and memory: node (its NUMA node's CPUs), socket (its socket's), exclusive (its "
     "even share of the node's physical cores), core-complex (a group of cores sharing the last-level cache); the "
     "node is the GPU's own for GPU workers, an even split of the NUMA nodes for CPU workers"},
    {"--log_line_prefix_template", nullptr, "log_line_prefix_template", true, "[rank${rank}]: ",
     "prefix of each console line; ${rank}, ${local_rank}, ${role_name}, ${hostname} (or ${host}) are "
     "replaced"},
    {"--start_method", nullptr, "start_method", true, "spawn", "accepted for torchrun compatibility; ignored"},
    {"--event_log_handler", nullptr, "event_log_handler", true, "null",
     "torchrun's event handler: null or console (ddprun's events are its log lines and --report_file either way)"},
    {"--logs_specs", nullptr, "logs_specs", true, "default",
     "torchrun's log layout plug-in: only 'default', the layout --log_dir describes, which ddprun writes"},
};

}  // namespace

std::span<const FlagDef> flag_table() { return kFlagTable; }

const FlagDef* find_flag(const std::string& spelled) {
  const std::string norm = command_line::canonical(spelled);
  for (const FlagDef& f : kFlagTable) {
    if (norm == f.name || (f.alias && norm == f.alias)) return &f;
  }
  return nullptr;
}

std::string usage_text() {
  std::ostringstream out;
  out << "Usage: ddprun [options] PROGRAM [ARGS...]\n\n"
         "Starts nproc_per_node workers of PROGRAM on this node with torchrun's environment (RANK, LOCAL_RANK,\n"
         "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), hosts their rendezvous store, supervises them, and reports\n"
         "which rank failed and why. A PROGRAM ending in .py runs under $PYTHON_EXEC (default python3) -u;\n"
         "anything else is executed directly. '${local_rank}' in ARGS is replaced per worker.\n\n"
         "Options:\n"
         "Dashes and underscores are interchangeable; each flag also reads PET_<NAME> from the environment.\n";
  for (const FlagDef& f : kFlagTable) {
    std::string names = f.alias ? std::string(f.alias) + ", " + f.name : std::string(f.name);
    if (f.takes_value) names += " VALUE";
    out << "  " << names << "\n      " << f.help;
    if (*f.default_text != '\0') out << " (default: " << f.default_text << ")";
    out << "\n";
  }
  out << "  -h, --help\n      show this help\n  --version\n      print the version\n\n"
         "--rdzv_conf keys (KEY=VALUE,...; a near miss of one is an error, other keys are ignored with a warning):\n";
  for (const RdzvConfKey& k : rdzv_conf_keys()) {
    out << "  " << k.name;
    if (*k.aliases != '\0') out << " (also " << k.aliases << ")";
    out << "\n      " << k.meaning << "\n";
  }
  out << "\n"
         "Exit status:\n"
         "0 when every worker succeeded; the root-cause worker's exit code (128+N if it died of signal\n"
         "N) when one failed; 124 when the job hung (--hang_timeout); 2 for a bad command line; 1 when ddprun\n"
         "itself could not run the job.\n";
  return out.str();
}

namespace {

std::string upper_text(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

int parse_signal(const std::string& text, const std::string& flag) {
  const std::string t = upper_text(trimmed(text));
  if (!t.empty() && std::all_of(t.begin(), t.end(), ::isdigit)) {
    const int n = t.size() <= 2 ? std::stoi(t) : 0;
    if (n >= 1 && n <= 64) return n;
  } else {
    const std::string name = t.rfind("SIG", 0) == 0 ? t.substr(3) : t;
    for (int s = 1; s < 32; ++s) {
      const char* abbrev = sigabbrev_np(s);
      if (abbrev && name == abbrev) return s;
    }
  }
  throw ConfigError(flag + ": expected signal names such as SIGTERM,SIGUSR1, got '" + text + "'");
}

}  // namespace ddprun::launcher::cli
