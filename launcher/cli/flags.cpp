#include "launcher/cli/flags.hpp"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <sstream>

#include "common/host_port.hpp"
#include "common/command_line.hpp"
#include "common/errors.hpp"
#include "common/numbers.hpp"
#include "launcher/cli/options_parse.hpp"
#include "rendezvous/core/job_namespace.hpp"

namespace ddprun::launcher::cli {
namespace {

using namespace options_detail;

// Every flag ddprun accepts, in --help order; a row's value is applied after those above it.
// Dashes and underscores are interchangeable after the leading "--".
constexpr FlagDef kFlagTable[] = {
    {"--nproc_per_node", nullptr, "N",
     "workers on this node: a number, `cpu` (one per CPU), `gpu` or `cuda` (one per visible GPU of PyTorch's `cuda` "
     "type: NVIDIA's, honouring `CUDA_VISIBLE_DEVICES`, or AMD's under ROCm, from the KFD topology in "
     "`/sys/class/kfd`, honouring `HIP_VISIBLE_DEVICES` and `ROCR_VISIBLE_DEVICES`), `xpu` (one per Intel GPU: "
     "render nodes of vendor 0x8086 under `/sys/class/drm`, or the entries of `ZE_AFFINITY_MASK`), `auto` (GPUs if "
     "any, else CPUs)",
     [](const LaunchOptions& d) { return d.nproc_spec; }, "", apply_nproc_per_node},
    {"--nnodes", nullptr, "N", "number of nodes, `N` or `MIN:MAX` (ranges with `--rdzv_backend` c10d or etcd)",
     [](const LaunchOptions& d) { return std::to_string(d.max_nodes); }, "", apply_nnodes, nullptr, false,
     "[Several nodes](multi-node.md#several-nodes)"},
    {"--node_rank", nullptr, "N", "rank of this node, `0..nnodes-1` (with c10d: an ordering hint)",
     [](const LaunchOptions& d) { return std::to_string(d.node_rank); }, "",
     [](const FlagInput& in, LaunchOptions& o) {
       o.node_rank = static_cast<int>(parse_int(in.flag, trim(in.text), 0, o.max_nodes - 1,
                                                "a node rank from 0 to " + std::to_string(o.max_nodes - 1) +
                                                    " (--nnodes is " + std::to_string(o.max_nodes) + ")"));
       o.node_rank_given = true;
     }},
    {"--master_addr", nullptr, "ADDR", "address of the store; `MASTER_ADDR` of the workers (`[::1]` style accepted)",
     [](const LaunchOptions& d) { return d.master_addr; }, "",
     [](const FlagInput& in, LaunchOptions& o) {
       // torchrun accepts IPv6 in brackets; the port is --master_port's.
       const auto addr = parse_host_port(trim(in.text));
       if (!addr || addr->port) bad(in.flag, "a host name or address (the port goes in --master_port)", in.text);
       o.master_addr = addr->host;
     }},
    {"--master_port", nullptr, "PORT", "port of the store; on one node `0` or unset lets the kernel pick a free one",
     nullptr, "kernel-picked (one node), `29500` (several)",
     [](const FlagInput& in, LaunchOptions& o) {
       const auto port = parse_int(in.flag, trim(in.text), 0, 65535, "a port from 0 to 65535");
       if (port != 0) o.master_port = static_cast<uint16_t>(port);
     }},
    {"--standalone", nullptr, nullptr,
     "a single-node job with an automatic store port and run id: ddprun's default anyway (accepted for torchrun "
     "compatibility)",
     nullptr, "off", [](const FlagInput&, LaunchOptions& o) { o.standalone = true; }},
    {"--rdzv_backend", nullptr, "NAME",
     "`static` (each node gives `--node_rank`), `c10d` (nodes join `--rdzv_endpoint` without ranks; `--nnodes "
     "MIN:MAX`) or `etcd` (the same through an etcd v3 cluster: no single point of failure)",
     [](const LaunchOptions& d) { return std::string(rdzv_backend_name(d.rdzv_backend)); }, "", apply_rdzv_backend,
     nullptr, false, "[On etcd](multi-node.md#on-etcd-v3---rdzv_backend-etcd)"},
    {"--rdzv_endpoint", nullptr, "HOST:PORT",
     "a `ddprun-rendezvous` daemon `host[:port]` (port 29400 if omitted) to rendezvous through; many jobs can share "
     "one. With etcd: the cluster's client URLs `host:port[,host:port...]` (`http://` or `https://` optional)",
     nullptr, "node 0 hosts it at `master_addr:master_port`", apply_rdzv_endpoint},
    {"--rdzv_id", "--run_id", "ID",
     "job id shared by all nodes (letters, digits and `. _ - :`); `TORCHELASTIC_RUN_ID`, and the name of the log "
     "directory. The same id can be run again on a shared daemon",
     [](const LaunchOptions& d) { return d.run_id; }, "",
     [](const FlagInput& in, LaunchOptions& o) {
       o.run_id = trim(in.text);
       std::string why;
       if (!rdzv::core::valid_run_id(o.run_id, &why)) {
         throw ConfigError(in.flag + ": '" + o.run_id + "' cannot name a job: " + why);
       }
     }},
    {"--rdzv_conf", nullptr, "KEY=VALUE,...",
     "rendezvous settings `k1=v1,k2=v2` (the keys are listed below); a key one or two edits from a known one is an "
     "error that names it (`jion_timeout`: did you mean `join_timeout`?), any other unknown key is ignored with a "
     "warning, as torchrun ignores it (Kubeflow's `PET_RDZV_CONF` passes through what the user wrote)",
     nullptr, "", apply_rdzv_conf, nullptr, false, "[the keys](#--rdzv_conf-keys)"},
    {"--max_restarts", nullptr, "N", "times the worker group is restarted after a failure or a hang",
     [](const LaunchOptions& d) { return std::to_string(d.max_restarts); }, "",
     [](const FlagInput& in, LaunchOptions& o) {
       o.max_restarts = static_cast<int>(parse_int(in.flag, trim(in.text), 0, 1 << 20, "a whole number >= 0"));
     }},
    {"--replica_group", nullptr, "ID",
     "run one replica group of a fault-tolerant job: its own world that fails and restarts alone, while the "
     "other groups of the job (the same `--rdzv_id`) go on training; needs `--rdzv_backend c10d` or `etcd`",
     nullptr, "none: an ordinary job",
     [](const FlagInput& in, LaunchOptions& o) {
       o.replica_group = static_cast<int>(parse_int(in.flag, trim(in.text), 0, 1 << 20, "a whole number >= 0"));
     },
     nullptr, false, "[fault tolerance](fault-tolerance.md)"},
    {"--min_replica_groups", nullptr, "K", "the fewest replica groups that may train a step (with `--replica_group`)",
     [](const LaunchOptions& d) { return std::to_string(d.min_replica_groups); }, "",
     [](const FlagInput& in, LaunchOptions& o) {
       o.min_replica_groups = static_cast<int>(parse_int(in.flag, trim(in.text), 1, 1 << 20, "a whole number >= 1"));
     },
     nullptr, false, "[fault tolerance](fault-tolerance.md)"},
    {"--hang_timeout", nullptr, "SECONDS",
     "seconds without progress from any rank after which the job is hung: every rank's stacks are captured and "
     "reported, then the job stops (exit code 124) or restarts (`--max_restarts`); 0 or at least 2",
     [](const LaunchOptions& d) {
       return seconds_text(d.hang_timeout) + (d.hang_timeout.count() == 0 ? " (off)" : "");
     },
     "",
     [](const FlagInput& in, LaunchOptions& o) {
       o.hang_timeout = parse_seconds(in.flag, trim(in.text), true);
       if (o.hang_timeout.count() > 0 && o.hang_timeout < std::chrono::seconds(2)) {
         bad(in.flag, "0 (off) or at least 2 seconds", in.text);
       }
     },
     nullptr, false, "[Hangs](#hangs---hang_timeout)"},
    {"--straggler_factor", nullptr, "FACTOR",
     "warn when a rank's compute time per step stays above this multiple of the median rank's for 3 checks in a "
     "row; `0` never warns",
     [](const LaunchOptions& d) { return number_text(d.straggler_factor); }, "",
     [](const FlagInput& in, LaunchOptions& o) {
       const auto v = to_double(trim(in.text));
       if (!v || !(*v == 0 || (*v > 1 && *v < 1000))) bad(in.flag, "0 (off) or a factor above 1, such as 1.5", in.text);
       o.straggler_factor = *v;
     }},
    {"--monitor_interval", nullptr, "SECONDS",
     "accepted for torchrun compatibility: worker exits are seen at once (SIGCHLD), other nodes are checked every "
     "`keep_alive_interval` (`--rdzv_conf`)",
     nullptr, "`0.1`",
     // A malformed value is still an error.
     [](const FlagInput& in, LaunchOptions&) { parse_seconds(in.flag, trim(in.text), false); }},
    {"--role", nullptr, "NAME", "`ROLE_NAME` of the workers", [](const LaunchOptions& d) { return d.role; }, "",
     [](const FlagInput& in, LaunchOptions& o) {
       o.role = trim(in.text);
       if (o.role.empty()) bad(in.flag, "a non-empty role name", in.text);
     }},
    {"--log_dir", nullptr, "DIR",
     "base directory of per-rank logs: `LOG_DIR/RUN_ID_XXXXXXXX/attempt_K/LOCAL_RANK/{stdout.log,stderr.log,"
     "error.json}`",
     nullptr, "a temporary directory", [](const FlagInput& in, LaunchOptions& o) { o.log_dir = in.text; }},
    {"--report_file", nullptr, "PATH",
     "at the end of every job, how it ended as one JSON document at this path (schema `ddprun-report/1`); `{host}` "
     "in the path is this host's name",
     nullptr, "none",
     [](const FlagInput& in, LaunchOptions& o) {
       o.report_file = trim(in.text);
       if (o.report_file.empty()) bad(in.flag, "a file path", in.text);
     },
     "DDPRUN_REPORT_FILE", false, "[the report file](#the-report-file---report_file)"},
    {"--http_port", nullptr, "PORT",
     "serve the job on this port: its live page at `/ui`, `/metrics` for Prometheus and a health endpoint for "
     "liveness probes; `0` picks a free port (said on the console)",
     nullptr, "none",
     [](const FlagInput& in, LaunchOptions& o) {
       o.http_port = static_cast<uint16_t>(parse_int(in.flag, trim(in.text), 0, 65535, "a port from 0 to 65535"));
       o.http_port_from = in.flag;
     },
     "TORCHELASTIC_HEALTH_CHECK_PORT", false, "[job views](job-views.md)"},
    {"--trace_file", nullptr, "PATH",
     "write the job as a Chrome/Perfetto trace (JSON trace events) at this path as it runs: a track per rank (its "
     "steps and waits) and one for the node (rendezvous, attempts, restarts, hangs); `{host}` is this host's name",
     nullptr, "none",
     [](const FlagInput& in, LaunchOptions& o) {
       o.trace_file = trim(in.text);
       if (o.trace_file.empty()) bad(in.flag, "a file path", in.text);
     },
     "DDPRUN_TRACE_FILE", false, "[job views](job-views.md#a-trace---trace_file)"},
    {"--redirects", "-r", "MODE",
     "worker output to log files only: `0` none, `1` stdout, `2` stderr, `3` both, or per local rank `0:1,1:3`",
     [](const LaunchOptions& d) { return streams_text(d.redirects); }, "",
     [](const FlagInput& in, LaunchOptions& o) { o.redirects = parse_streams(in.flag, in.text); }},
    {"--tee", "-t", "MODE", "like `--redirects`, but also to the console",
     [](const LaunchOptions& d) { return streams_text(d.tee); }, "",
     [](const FlagInput& in, LaunchOptions& o) { o.tee = parse_streams(in.flag, in.text); }},
    {"--local_ranks_filter", nullptr, "RANKS",
     "show only these local ranks on the console, e.g. `0` or `0,3` (log files keep everything)", nullptr, "all",
     [](const FlagInput& in, LaunchOptions& o) {
       if (trim(in.text).empty()) return;
       std::set<int> ranks;
       for (const std::string& r : split(in.text, ',')) {
         ranks.insert(
             static_cast<int>(parse_int(in.flag, r, 0, 1 << 20, "comma-separated local ranks such as '0' or '0,2'")));
       }
       o.local_ranks_filter = std::move(ranks);
     }},
    {"--duplicate_stdout_filters", nullptr, "FILTERS",
     "lines of the workers' stdout that contain one of these comma-separated substrings (`,,` is a comma inside "
     "one) also go to `filtered_stdout.log` in the attempt's log directory, prefixed as on the console, every rank's "
     "in one file (torchrun's `--duplicate-stdout-filters`); the console and the rank logs are unchanged, and the "
     "run directory is kept",
     nullptr, "none",
     [](const FlagInput& in, LaunchOptions& o) { o.duplicate_stdout_filters = parse_filters(in.flag, in.text); }},
    {"--duplicate_stderr_filters", nullptr, "FILTERS", "the same for stderr, into `filtered_stderr.log`", nullptr,
     "none",
     [](const FlagInput& in, LaunchOptions& o) { o.duplicate_stderr_filters = parse_filters(in.flag, in.text); }},
    {"--merge_lines", nullptr, "SECONDS",
     "print a console line that several ranks of the node write within the window (1 s; at most 60) once, prefixed "
     "with all of them: `[rank0-7]: epoch 3 done` (the `--log_line_prefix_template` with the ranks as ranges); "
     "`--merge_lines=SECONDS` sets the window. Each rank's lines keep their order, lines wait up to the window, and "
     "log files keep every rank's lines as written",
     nullptr, "off",
     [](const FlagInput& in, LaunchOptions& o) {
       o.merge_lines = parse_seconds(in.flag, trim(in.text), true);
       if (o.merge_lines > std::chrono::minutes(1)) {
         bad(in.flag, "a window of at most 60 seconds (the console waits that long for each line)", in.text);
       }
     },
     nullptr, true},
    {"--no_python", nullptr, nullptr, "run the program directly even if it ends in `.py`", nullptr, "off",
     [](const FlagInput&, LaunchOptions& o) { o.no_python = true; }},
    {"--module", "-m", nullptr, "run the program as a Python module (`python -m`)", nullptr, "off",
     [](const FlagInput&, LaunchOptions& o) { o.module = true; }},
    {"--run_path", nullptr, nullptr,
     "run the program as a Python script whatever its name, as torchrun's `--run-path` runs it with "
     "`runpy.run_path`; wins over `--no_python`",
     nullptr, "off", [](const FlagInput&, LaunchOptions& o) { o.run_path = true; }},
    {"--preload", nullptr, "MODULES",
     "Python modules (comma-separated, e.g. `torch`) that one interpreter per node imports once; Python workers are "
     "then forked from it instead of started anew, restarts included",
     nullptr, "none", [](const FlagInput& in, LaunchOptions& o) { o.preload = parse_preload(in.flag, in.text); },
     "DDPRUN_PRELOAD", false, "[`--preload`](#python-workers-that-start-at-once---preload)"},
    {"--local_rank_arg", nullptr, "FORM",
     "pass `--local_rank=N` as the program's first argument, exactly as `torch.distributed.launch` (1.x) did, so "
     "scripts that read `--local_rank` from argv run unchanged; `--local_rank_arg=dash` passes `--local-rank=N`, as "
     "2.x does (`=underscore` is the 1.x form)",
     nullptr, "off",
     [](const FlagInput& in, LaunchOptions& o) {
       const std::string v = trim(in.text);
       if (v == "1" || v == "underscore") {
         o.local_rank_arg = LocalRankArg::Underscore;
       } else if (v == "dash") {
         o.local_rank_arg = LocalRankArg::Dash;
       } else {
         bad(in.flag,
             "no value (--local_rank=N, torch.distributed.launch 1.x), 'underscore' (the same) or 'dash' "
             "(--local-rank=N, 2.x)",
             in.text);
       }
     },
     nullptr, true},
    {"--use_env", nullptr, nullptr,
     "accepted for `torch.distributed.launch` compatibility (the workers always get `LOCAL_RANK` in their "
     "environment); contradicts `--local_rank_arg`",
     nullptr, "off", [](const FlagInput&, LaunchOptions& o) { o.use_env = true; }},
    {"--local_addr", nullptr, "ADDR",
     "this node's address, used as `MASTER_ADDR` and by the other nodes, as torchrun's (`socket.getfqdn()`: a "
     "Kubernetes pod with a subdomain is reachable by that name only)",
     nullptr, "this host's fully qualified name (node 0 of a static job: `--master_addr`)",
     [](const FlagInput& in, LaunchOptions& o) { o.local_addr = trim(in.text); }},
    {"--signals_to_handle", nullptr, "SIGNALS",
     "signals forwarded to every worker's process group. SIGTERM/SIGINT/SIGHUP/SIGQUIT also stop the job; others "
     "(`SIGUSR1`, `SIGUSR2`, e.g. for Slurm preemption) are only forwarded",
     [](const LaunchOptions& d) { return signals_text(d.signals_to_handle); }, "", apply_signals},
    {"--shutdown_timeout", nullptr, "SECONDS", "seconds between the stop signal and SIGKILL",
     [](const LaunchOptions& d) { return seconds_text(d.shutdown_timeout); }, "",
     [](const FlagInput& in, LaunchOptions& o) { o.shutdown_timeout = parse_seconds(in.flag, trim(in.text), true); },
     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"},
    {"--kill_timeout", nullptr, "SECONDS",
     "seconds a worker may take to exit after SIGKILL (tearing down a large address space or a GPU context takes "
     "seconds) before ddprun reports it as unkillable (asleep in the kernel, state `D`: a hung driver, NFS or FUSE "
     "server), leaves it behind, and ends without restarting on this node",
     [](const LaunchOptions& d) { return seconds_text(d.kill_timeout); }, "",
     [](const FlagInput& in, LaunchOptions& o) { o.kill_timeout = parse_seconds(in.flag, trim(in.text), false); },
     nullptr, false, "[unkillable workers](#workers-that-sigkill-does-not-end)"},
    {"--virtual_local_rank", nullptr, nullptr,
     "each worker sees exactly one GPU and gets `LOCAL_RANK=0`, so no rank creates a context on GPU 0: in "
     "`CUDA_VISIBLE_DEVICES` on NVIDIA, `HIP_VISIBLE_DEVICES` on AMD (within `ROCR_VISIBLE_DEVICES`, left as it "
     "is), `ZE_AFFINITY_MASK` on Intel",
     nullptr, "off", [](const FlagInput&, LaunchOptions& o) { o.virtual_local_rank = true; }},
    {"--numa_binding", nullptr, "MODE",
     "bind each local rank's CPUs and memory: `node` (its NUMA node's CPUs), `socket` (its socket's), `exclusive` "
     "(its even share of the node's physical cores) or `core-complex` (a group of cores sharing the last-level "
     "cache); the node is the GPU's own for GPU workers, an even split of the NUMA nodes for CPU workers",
     nullptr, "off",
     [](const FlagInput& in, LaunchOptions& o) {
       const auto mode = workers::parse_numa_binding(trim(in.text));
       if (!mode) bad(in.flag, "node, socket, exclusive or core-complex", in.text);
       o.numa_binding = *mode;
     },
     nullptr, false, "[placement](#cpu-and-memory-placement---numa_binding)"},
    {"--log_line_prefix_template", nullptr, "TEMPLATE",
     "console prefix of each line; `${rank}`, `${local_rank}`, `${role_name}`, `${hostname}` (torchrun's "
     "spelling; `${host}` also works) are replaced",
     [](const LaunchOptions& d) { return d.log_line_prefix; }, "",
     [](const FlagInput& in, LaunchOptions& o) { o.log_line_prefix = in.text; },
     "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"},
    {"--start_method", nullptr, "METHOD", "accepted for torchrun compatibility; ignored", nullptr, "`spawn`",
     [](const FlagInput&, LaunchOptions&) {}},
    {"--event_log_handler", nullptr, "NAME",
     "torchrun's event handler: `null` or `console` are accepted (ddprun's events are its log lines and the "
     "`--report_file` document either way); another name is an error that says so",
     nullptr, "`null`",
     [](const FlagInput& in, LaunchOptions&) {
       const std::string v = trim(in.text);
       if (v != "null" && v != "console") {
         bad(in.flag,
             "'null' or 'console' (ddprun has no registry of Python event handlers: its events are its log "
             "lines on stderr and the --report_file JSON document)",
             v);
       }
     }},
    {"--logs_specs", nullptr, "NAME",
     "torchrun's log-layout plug-in: `default` (the layout `--log_dir` describes, which ddprun writes); another name "
     "is an error (ddprun loads no Python entry points)",
     nullptr, "`default`",
     [](const FlagInput& in, LaunchOptions&) {
       if (trim(in.text) != "default") {
         bad(in.flag,
             "'default' (ddprun cannot load Python entry points; it writes torchrun's default layout: set "
             "where with --log_dir and what with --redirects and --tee)",
             in.text);
       }
     }},
};

}  // namespace

std::string FlagDef::default_text() const { return shown ? shown(LaunchOptions{}) : std::string(note); }

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
    if (f.takes_value()) names += std::string(" ") + f.value;
    out << "  " << names << "\n      " << command_line::plain(f.help);
    if (f.env) out << "; also read from " << f.env;
    if (const std::string shown = command_line::plain(f.default_text()); !shown.empty())
      out << " (default: " << shown << ")";
    out << "\n";
  }
  out << "  -h, --help\n      show this help (--help=markdown: the flags and the --rdzv_conf keys as Markdown tables)\n"
         "  --version\n      print the version\n\n"
         "--rdzv_conf keys (KEY=VALUE,...; a near miss of one is an error, other keys are ignored with a warning):\n";
  for (const RdzvConfKey& k : rdzv_conf_keys()) {
    out << "  " << k.name;
    if (*k.aliases != '\0') out << " (also " << k.aliases << ")";
    out << "\n      " << command_line::plain(k.help);
    if (const std::string shown = command_line::plain(k.default_text()); !shown.empty())
      out << " (default: " << shown << ")";
    out << "\n";
  }
  out << "\n"
         "Exit status:\n"
         "0 when every worker succeeded; the root-cause worker's exit code (128+N if it died of signal\n"
         "N) when one failed; 124 when the job hung (--hang_timeout); 2 for a bad command line; 1 when ddprun\n"
         "itself could not run the job.\n";
  return out.str();
}

std::string flag_table_markdown() {
  auto code = [](const std::string& s) { return "`" + s + "`"; };
  std::string out = "| flag | default | meaning |\n|---|---|---|\n";
  for (const FlagDef& f : kFlagTable) {
    std::string name = f.name;
    if (f.optional_value) name += std::string("[=") + f.value + "]";
    std::string names = code(name);
    if (f.alias)
      names = std::string(f.alias).rfind("--", 0) == 0 ? names + ", " + code(f.alias) : code(f.alias) + ", " + names;
    std::string meaning = f.help;
    if (f.env) meaning += std::string(" (also `") + f.env + "`; the flag wins)";
    if (f.see) meaning += std::string("; see ") + f.see;
    out += command_line::markdown_row(
               {names, f.shown ? command_line::markdown_default(f.shown(LaunchOptions{})) : f.note, meaning}) +
           "\n";
  }
  out += command_line::markdown_row({"`-h`, `--help` / `--version`", "",
                                     "every flag with its default (`--help=markdown`: these tables) / the version"}) +
         "\n";
  out +=
      "\n### `--rdzv_conf` keys\n\n"
      "Every key torchrun 2.x accepts is either honoured or accepted with the meaning below; `ddprun --help`\n"
      "lists them too. Booleans take `1/true/yes/on` or `0/false/no/off`.\n\n"
      "| key (torchrun's other spellings) | default | meaning in ddprun |\n|---|---|---|\n";
  for (const RdzvConfKey& k : rdzv_conf_keys()) {
    std::string names = code(k.name);
    if (*k.aliases != '\0') {
      std::string others;
      for (const std::string& alias : split(k.aliases, ',')) others += (others.empty() ? "" : ", ") + code(alias);
      names += " (" + others + ")";
    }
    std::string meaning = k.help;
    if (k.see) meaning += std::string("; see ") + k.see;
    out += command_line::markdown_row(
               {names, k.shown ? command_line::markdown_default(k.shown(LaunchOptions{})) : k.note, meaning}) +
           "\n";
  }
  return out;
}

int parse_signal(const std::string& text, const std::string& flag) {
  const std::string t = upper(trim(text));
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
