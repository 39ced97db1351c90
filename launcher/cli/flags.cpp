#include "launcher/cli/flags.hpp"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstring>

#include "common/host_port.hpp"
#include "common/command_line.hpp"
#include "common/errors.hpp"
#include "common/numbers.hpp"
#include "launcher/cli/options_parse.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/server/host_check.hpp"

namespace ddprun::launcher::cli {
namespace {

using namespace options_detail;
using options::on;
using options::seconds;
using options::text;
using options::whole;

// Every flag ddprun accepts, in --help order; a row's value is applied after those above it.
// Dashes and underscores are interchangeable after the leading "--".
constexpr FlagDef kFlagTable[] = {
    {"--nproc_per_node",
     "",
     "N",
     "workers on this node: a number, `cpu` (one per CPU), `gpu` or `cuda` (one per visible GPU of PyTorch's `cuda` "
     "type: NVIDIA's, honouring `CUDA_VISIBLE_DEVICES`, or AMD's under ROCm, from the KFD topology in "
     "`/sys/class/kfd`, honouring `HIP_VISIBLE_DEVICES` and `ROCR_VISIBLE_DEVICES`), `xpu` (one per Intel GPU: "
     "render nodes of vendor 0x8086 under `/sys/class/drm`, or the entries of `ZE_AFFINITY_MASK`), `auto` (GPUs if "
     "any, else CPUs)",
     {apply_nproc_per_node, [](const LaunchOptions& d) { return d.nproc_spec; }}},
    {"--nnodes",
     "",
     "N",
     "number of nodes, `N` or `MIN:MAX` (ranges with `--rdzv_backend` c10d or etcd)",
     {apply_nnodes, [](const LaunchOptions& d) { return std::to_string(d.max_nodes); }},
     "",
     nullptr,
     false,
     "[Several nodes](multi-node.md#several-nodes)"},
    {"--node_rank",
     "",
     "N",
     "rank of this node, `0..nnodes-1` (with c10d: an ordering hint)",
     {[](const FlagInput& in, LaunchOptions& o) {
        o.node_rank = static_cast<int>(parse_whole(in.flag, trim(in.text), 0, o.max_nodes - 1,
                                                   "a node rank from 0 to " + std::to_string(o.max_nodes - 1) +
                                                       " (--nnodes is " + std::to_string(o.max_nodes) + ")"));
        o.node_rank_given = true;
      },
      [](const LaunchOptions& d) { return std::to_string(d.node_rank); }}},
    {"--master_addr",
     "",
     "ADDR",
     "address of the store; `MASTER_ADDR` of the workers (`[::1]` style accepted)",
     {[](const FlagInput& in, LaunchOptions& o) {
        // torchrun accepts IPv6 in brackets; the port is --master_port's.
        const auto addr = parse_host_port(trim(in.text));
        if (!addr || addr->port) bad_value(in.flag, "a host name or address (the port goes in --master_port)", in.text);
        o.master_addr = addr->host;
      },
      [](const LaunchOptions& d) { return d.master_addr; }}},
    {"--master_port", "", "PORT", "port of the store; on one node `0` or unset lets the kernel pick a free one",
     [](const FlagInput& in, LaunchOptions& o) {
       const auto port = parse_whole(in.flag, trim(in.text), 0, 65535, options::kPortExpected);
       if (port != 0) o.master_port = static_cast<uint16_t>(port);
     },
     "kernel-picked (one node), `29500` (several)"},
    {"--standalone", "", nullptr,
     "a single-node job with an automatic store port and run id: ddprun's default anyway (accepted for torchrun "
     "compatibility)",
     on<&LaunchOptions::standalone>(), "off"},
    {"--rdzv_backend",
     "",
     "NAME",
     "`static` (each node gives `--node_rank`), `c10d` (nodes join `--rdzv_endpoint` without ranks; `--nnodes "
     "MIN:MAX`) or `etcd` (the same through an etcd v3 cluster: no single point of failure)",
     {apply_rdzv_backend, [](const LaunchOptions& d) { return std::string(rdzv_backend_name(d.rdzv_backend)); }},
     "",
     nullptr,
     false,
     "[On etcd](multi-node.md#on-etcd-v3---rdzv_backend-etcd)"},
    {"--rdzv_endpoint", "", "HOST:PORT",
     "a `ddprun-rendezvous` daemon `host[:port]` (port 29400 if omitted) to rendezvous through; many jobs can share "
     "one. With etcd: the cluster's client URLs `host:port[,host:port...]` (`http://` or `https://` optional)",
     apply_rdzv_endpoint, "node 0 hosts it at `master_addr:master_port`"},
    {"--rdzv_id",
     "--run_id",
     "ID",
     "job id shared by all nodes (letters, digits and `. _ - :`); `TORCHELASTIC_RUN_ID`, and the name of the log "
     "directory. The same id can be run again on a shared daemon",
     {[](const FlagInput& in, LaunchOptions& o) {
        o.run_id = trim(in.text);
        std::string why;
        if (!rdzv::core::valid_run_id(o.run_id, &why)) {
          throw ConfigError(in.flag + ": '" + o.run_id + "' cannot name a job: " + why);
        }
      },
      [](const LaunchOptions& d) { return d.run_id; }}},
    {"--rdzv_conf", "", "KEY=VALUE,...",
     "rendezvous settings `k1=v1,k2=v2` (the keys are listed below; quotes around the whole list, `'k1=v1,k2=v2'`, "
     "are dropped); a key one or two edits from a known one is an "
     "error that names it (`jion_timeout`: did you mean `join_timeout`?), any other unknown key is ignored with a "
     "warning, as torchrun ignores it (Kubeflow's `PET_RDZV_CONF` passes through what the user wrote)",
     apply_rdzv_conf, "", nullptr, false, "[the keys](#--rdzv_conf-keys)"},
    {"--max_restarts", "", "N", "times the worker group is restarted after a failure or a hang",
     whole<&LaunchOptions::max_restarts>(0, 1 << 20, "a whole number >= 0")},
    {"--no_restart_exit_codes",
     "",
     "CODES",
     "worker exit codes that mean \"do not restart\": a failure whose root cause exits with one ends the job with "
     "that code, whatever `--max_restarts` leaves (`93` is NVIDIA's ft_launcher's); comma-separated, `none` for none",
     {set_no_restart_exit_codes, show_no_restart_exit_codes}},
    {"--node_check", "", "COMMAND",
     "a health check (`/bin/sh -c COMMAND`) run before this node joins each round: a node whose check fails "
     "(exits non-zero, or runs past `--node_check_timeout`) leaves the job with its last line as the reason; an "
     "elastic job goes on without it, a static one ends with a report that names the node and the check",
     text<&LaunchOptions::node_check>(false), "none"},
    {"--node_check_timeout", "", "SECONDS", "how long `--node_check` (and `--check_gpus`' nvidia-smi) may run",
     seconds<&LaunchOptions::node_check_timeout>(false)},
    {"--check_free_space",
     "",
     "PATH:SIZE,...",
     "a built-in health check: the file system of each PATH (logs, checkpoints) has SIZE free (`10G`, `500M`, "
     "`2T`: powers of 1024; a number alone is bytes); `none` for none",
     {set_free_space_checks, show_none}},
    {"--check_interface",
     "",
     "NAME,...",
     "a built-in health check: each network interface NAME is there and up (`/sys/class/net/NAME`); `none` for "
     "none",
     {set_interface_checks, show_none}},
    {"--check_gpus", "", nullptr,
     "a built-in health check: every GPU this node's workers are to use (`CUDA_VISIBLE_DEVICES`, or the first "
     "`--nproc_per_node`) answers `nvidia-smi` within `--node_check_timeout`",
     on<&LaunchOptions::check_gpus>(), "off"},
    {"--max_unfit_leaves", "", "N",
     "a host whose nodes left this run of the job N times unfit for it (a failed health check, a worker's request "
     "to leave) is not taken back: an agent started there again leaves at once, without disturbing the job "
     "(counted per host name in the rendezvous, for as long as the job runs); 0: always taken back",
     whole<&LaunchOptions::max_unfit_leaves>(0, 1000, "a whole number from 0 to 1000")},
    {"--max_no_progress_restarts", "", "N",
     "restarts in a row that get no further than the training iterations the program reported before them "
     "(`worker::report_iterations`, the progress page's `iterations`) end the job with exit code 125 and "
     "\"no progress\" in its report; 0: never; a program that reports no iterations is never stopped so",
     whole<&LaunchOptions::max_no_progress_restarts>(0, 1 << 20, "a whole number >= 0")},
    {"--iterations_file", "", "PATH",
     "a file the program writes the training iterations it has completed to, as a decimal count (Megatron-LM's "
     "`latest_checkpointed_iteration.txt` is one), read with the progress pages for `--max_no_progress_restarts` "
     "when a worker fails; a file that says anything else is reported and ignored",
     text<&LaunchOptions::iterations_file>(false), "none"},
    {"--replica_group", "", "ID",
     "run one replica group of a fault-tolerant job: its own world that fails and restarts alone, while the "
     "other groups of the job (the same `--rdzv_id`) go on training; needs `--rdzv_backend c10d` or `etcd`",
     [](const FlagInput& in, LaunchOptions& o) {
       o.replica_group = static_cast<int>(parse_whole(in.flag, trim(in.text), 0, 1 << 20, "a whole number >= 0"));
     },
     "none: an ordinary job", nullptr, false, "[fault tolerance](fault-tolerance.md)"},
    {"--min_replica_groups", "", "K", "the fewest replica groups that may train a step (with `--replica_group`)",
     whole<&LaunchOptions::min_replica_groups>(1, 1 << 20, "a whole number >= 1"), "", nullptr, false,
     "[fault tolerance](fault-tolerance.md)"},
    {"--hang_timeout",
     "",
     "SECONDS",
     "seconds without progress from any rank after which the job is hung: every rank's stacks are captured and "
     "reported, then the job stops (exit code 124) or restarts (`--max_restarts`); 0 or at least 2",
     {[](const FlagInput& in, LaunchOptions& o) {
        o.hang_timeout = parse_seconds(in.flag, trim(in.text), true);
        if (o.hang_timeout.count() > 0 && o.hang_timeout < std::chrono::seconds(2)) {
          bad_value(in.flag, "0 (off) or at least 2 seconds", in.text);
        }
      },
      [](const LaunchOptions& d) {
        return seconds_text(d.hang_timeout) + (d.hang_timeout.count() == 0 ? " (off)" : "");
      }},
     "",
     nullptr,
     false,
     "[Hangs](#hangs---hang_timeout)"},
    {"--straggler_factor",
     "",
     "FACTOR",
     "warn when a rank's compute time per step stays above this multiple of the median rank's for 3 checks in a "
     "row; `0` never warns",
     {[](const FlagInput& in, LaunchOptions& o) {
        const auto v = to_double(trim(in.text));
        if (!v || !(*v == 0 || (*v > 1 && *v < 1000)))
          bad_value(in.flag, "0 (off) or a factor above 1, such as 1.5", in.text);
        o.straggler_factor = *v;
      },
      [](const LaunchOptions& d) { return number_text(d.straggler_factor); }}},
    {"--monitor_interval", "", "SECONDS",
     "accepted for torchrun compatibility: worker exits are seen at once (SIGCHLD), other nodes are checked every "
     "`keep_alive_interval` (`--rdzv_conf`)",  // A malformed value is still an error.
     [](const FlagInput& in, LaunchOptions&) { parse_seconds(in.flag, trim(in.text), false); }, "`0.1`"},
    {"--role",
     "",
     "NAME",
     "`ROLE_NAME` of the workers",
     {[](const FlagInput& in, LaunchOptions& o) {
        o.role = trim(in.text);
        if (o.role.empty()) bad_value(in.flag, "a non-empty role name", in.text);
      },
      [](const LaunchOptions& d) { return d.role; }}},
    {"--log_dir", "", "DIR",
     "base directory of per-rank logs: `LOG_DIR/RUN_ID_XXXXXXXX/attempt_K/LOCAL_RANK/{stdout.log,stderr.log,"
     "error.json}`",
     text<&LaunchOptions::log_dir>(false), "a temporary directory"},
    {"--report_file", "", "PATH",
     "at the end of every job, how it ended as one JSON document at this path (schema `ddprun-report/1`); `{host}` "
     "in the path is this host's name",
     [](const FlagInput& in, LaunchOptions& o) {
       o.report_file = trim(in.text);
       if (o.report_file.empty()) bad_value(in.flag, "a file path", in.text);
     },
     "none", "DDPRUN_REPORT_FILE", false, "[the report file](#the-report-file---report_file)"},
    {"--http_port", "", "PORT",
     "serve the job on this port: its live page at `/ui`, `/metrics` for Prometheus and a health endpoint for "
     "liveness probes; `0` picks a free port (said on the console)",
     [](const FlagInput& in, LaunchOptions& o) {
       o.http_port = static_cast<uint16_t>(parse_whole(in.flag, trim(in.text), 0, 65535, options::kPortExpected));
       o.http_port_from = in.flag;
     },
     "none", "TORCHELASTIC_HEALTH_CHECK_PORT", false, "[job views](job-views.md)"},
    {"--http_allowed_hosts", "", "NAMES",
     "more names the job page may be asked under, comma-separated (`node7.example.com`, `10.0.0.7`, "
     "`.example.com` for a domain, `*` for any): it answers only requests addressed to this host by one of its "
     "names or addresses, so that no page of another site whose name resolves here (DNS rebinding) reads it",
     [](const FlagInput& in, LaunchOptions& o) {
       o.http_allowed_hosts = rdzv::server::parse_allowed_hosts(in.flag, in.text);
     },
     "this host's names and addresses", nullptr, false,
     "[names the pages answer under](job-views.md#names-the-pages-answer-under)"},
    {"--trace_file", "", "PATH",
     "write the job as a Chrome/Perfetto trace (JSON trace events) at this path as it runs: a track per rank (its "
     "steps and waits) and one for the node (rendezvous, attempts, restarts, hangs); `{host}` is this host's name",
     [](const FlagInput& in, LaunchOptions& o) {
       o.trace_file = trim(in.text);
       if (o.trace_file.empty()) bad_value(in.flag, "a file path", in.text);
     },
     "none", "DDPRUN_TRACE_FILE", false, "[job views](job-views.md#a-trace---trace_file)"},
    {"--redirects",
     "-r",
     "MODE",
     "worker output to log files only: `0` none, `1` stdout, `2` stderr, `3` both, or per local rank `0:1,1:3`",
     {[](const FlagInput& in, LaunchOptions& o) { o.redirects = parse_streams(in.flag, in.text); },
      [](const LaunchOptions& d) { return streams_text(d.redirects); }}},
    {"--tee",
     "-t",
     "MODE",
     "like `--redirects`, but also to the console",
     {[](const FlagInput& in, LaunchOptions& o) { o.tee = parse_streams(in.flag, in.text); },
      [](const LaunchOptions& d) { return streams_text(d.tee); }}},
    {"--local_ranks_filter", "", "RANKS",
     "show only these local ranks on the console, e.g. `0` or `0,3` (log files keep everything)",
     [](const FlagInput& in, LaunchOptions& o) {
       if (trim(in.text).empty()) return;
       std::set<int> ranks;
       for (const std::string& r : split(in.text, ',')) {
         ranks.insert(
             static_cast<int>(parse_whole(in.flag, r, 0, 1 << 20, "comma-separated local ranks such as '0' or '0,2'")));
       }
       o.local_ranks_filter = std::move(ranks);
     },
     "all"},
    {"--duplicate_stdout_filters", "", "FILTERS",
     "lines of the workers' stdout that contain one of these comma-separated substrings (`,,` is a comma inside "
     "one) also go to `filtered_stdout.log` in the attempt's log directory, prefixed as on the console, every rank's "
     "in one file (torchrun's `--duplicate-stdout-filters`); the console and the rank logs are unchanged, and the "
     "run directory is kept",
     [](const FlagInput& in, LaunchOptions& o) { o.duplicate_stdout_filters = parse_filters(in.flag, in.text); },
     "none"},
    {"--duplicate_stderr_filters", "", "FILTERS", "the same for stderr, into `filtered_stderr.log`",
     [](const FlagInput& in, LaunchOptions& o) { o.duplicate_stderr_filters = parse_filters(in.flag, in.text); },
     "none"},
    {"--merge_lines", "", "SECONDS",
     "print a console line that several ranks of the node write within the window (1 s; at most 60) once, prefixed "
     "with all of them: `[rank0-7]: epoch 3 done` (the `--log_line_prefix_template` with the ranks as ranges); "
     "`--merge_lines=SECONDS` sets the window. Each rank's lines keep their order, lines wait up to the window, and "
     "log files keep every rank's lines as written",
     [](const FlagInput& in, LaunchOptions& o) {
       o.merge_lines = parse_seconds(in.flag, trim(in.text), true);
       if (o.merge_lines > std::chrono::minutes(1)) {
         bad_value(in.flag, "a window of at most 60 seconds (the console waits that long for each line)", in.text);
       }
     },
     "off", nullptr, true},
    {"--no_python", "", nullptr, "run the program directly even if it ends in `.py`", on<&LaunchOptions::no_python>(),
     "off"},
    {"--module", "-m", nullptr, "run the program as a Python module (`python -m`)", on<&LaunchOptions::module>(),
     "off"},
    {"--run_path", "", nullptr,
     "run the program as a Python script whatever its name, as torchrun's `--run-path` runs it with "
     "`runpy.run_path`; wins over `--no_python`",
     on<&LaunchOptions::run_path>(), "off"},
    {"--preload", "", "MODULES",
     "Python modules (comma-separated, e.g. `torch`) that one interpreter per node imports once; Python workers are "
     "then forked from it instead of started anew, restarts included",
     [](const FlagInput& in, LaunchOptions& o) { o.preload = parse_preload(in.flag, in.text); }, "none",
     "DDPRUN_PRELOAD", false, "[`--preload`](#python-workers-that-start-at-once---preload)"},
    {"--local_rank_arg", "", "FORM",
     "pass `--local_rank=N` as the program's first argument, exactly as `torch.distributed.launch` (1.x) did, so "
     "scripts that read `--local_rank` from argv run unchanged; `--local_rank_arg=dash` passes `--local-rank=N`, as "
     "2.x does (`=underscore` is the 1.x form)",
     [](const FlagInput& in, LaunchOptions& o) {
       const std::string v = trim(in.text);
       if (v == "1" || v == "underscore") {
         o.local_rank_arg = LocalRankArg::Underscore;
       } else if (v == "dash") {
         o.local_rank_arg = LocalRankArg::Dash;
       } else {
         bad_value(in.flag,
                   "no value (--local_rank=N, torch.distributed.launch 1.x), 'underscore' (the same) or 'dash' "
                   "(--local-rank=N, 2.x)",
                   in.text);
       }
     },
     "off", nullptr, true},
    {"--use_env", "", nullptr,
     "accepted for `torch.distributed.launch` compatibility (the workers always get `LOCAL_RANK` in their "
     "environment); contradicts `--local_rank_arg`",
     on<&LaunchOptions::use_env>(), "off"},
    {"--local_addr", "", "ADDR",
     "this node's address, used as `MASTER_ADDR` and by the other nodes, as torchrun's (`socket.getfqdn()`: a "
     "Kubernetes pod with a subdomain is reachable by that name only)",
     [](const FlagInput& in, LaunchOptions& o) { o.local_addr = trim(in.text); },
     "this host's fully qualified name (node 0 of a static job: `--master_addr`)"},
    {"--signals_to_handle",
     "",
     "SIGNALS",
     "signals forwarded to every worker's process group. SIGTERM/SIGINT/SIGHUP/SIGQUIT also stop the job; others "
     "(`SIGUSR1`, `SIGUSR2`, e.g. for Slurm preemption) are only forwarded",
     {apply_signals, [](const LaunchOptions& d) { return signals_text(d.signals_to_handle); }}},
    {"--shutdown_timeout", "", "SECONDS", "seconds between the stop signal and SIGKILL",
     seconds<&LaunchOptions::shutdown_timeout>(true), "", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"},
    {"--kill_timeout", "", "SECONDS",
     "seconds a worker may take to exit after SIGKILL (tearing down a large address space or a GPU context takes "
     "seconds) before ddprun reports it as unkillable (asleep in the kernel, state `D`: a hung driver, NFS or FUSE "
     "server), leaves it behind, and ends without restarting on this node",
     seconds<&LaunchOptions::kill_timeout>(false), "", nullptr, false,
     "[unkillable workers](#workers-that-sigkill-does-not-end)"},
    {"--virtual_local_rank", "", nullptr,
     "each worker sees exactly one GPU and gets `LOCAL_RANK=0`, so no rank creates a context on GPU 0: in "
     "`CUDA_VISIBLE_DEVICES` on NVIDIA, `HIP_VISIBLE_DEVICES` on AMD (within `ROCR_VISIBLE_DEVICES`, left as it "
     "is), `ZE_AFFINITY_MASK` on Intel",
     on<&LaunchOptions::virtual_local_rank>(), "off"},
    {"--numa_binding", "", "MODE",
     "bind each local rank's CPUs and memory: `node` (its NUMA node's CPUs), `socket` (its socket's), `exclusive` "
     "(its even share of the node's physical cores) or `core-complex` (a group of cores sharing the last-level "
     "cache); the node is the GPU's own for GPU workers, an even split of the NUMA nodes for CPU workers",
     [](const FlagInput& in, LaunchOptions& o) {
       const auto mode = workers::parse_numa_binding(trim(in.text));
       if (!mode) bad_value(in.flag, "node, socket, exclusive or core-complex", in.text);
       o.numa_binding = *mode;
     },
     "off", nullptr, false, "[placement](#cpu-and-memory-placement---numa_binding)"},
    {"--log_line_prefix_template", "", "TEMPLATE",
     "console prefix of each line, expanded as torchrun 2.x expands it (Python's `string.Template`): `${rank}`, "
     "`${local_rank}`, `${role_name}` and ddprun's `${hostname}` (or `${host}`) are replaced, also without braces "
     "(`$rank`), and `$$` is a `$`",
     text<&LaunchOptions::log_line_prefix>(), "", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"},
    {"--start_method", "", "METHOD", "accepted for torchrun compatibility; ignored",
     [](const FlagInput&, LaunchOptions&) {}, "`spawn`"},
    {"--event_log_handler", "", "NAME",
     "torchrun's event handler: `null` or `console` are accepted (ddprun's events are its log lines and the "
     "`--report_file` document either way); another name is an error that says so",
     [](const FlagInput& in, LaunchOptions&) {
       const std::string v = trim(in.text);
       if (v != "null" && v != "console") {
         bad_value(in.flag,
                   "'null' or 'console' (ddprun has no registry of Python event handlers: its events are its log "
                   "lines on stderr and the --report_file JSON document)",
                   v);
       }
     },
     "`null`"},
    {"--logs_specs", "", "NAME",
     "torchrun's log-layout plug-in: `default` (the layout `--log_dir` describes, which ddprun writes); another name "
     "is an error (ddprun loads no Python entry points)",
     [](const FlagInput& in, LaunchOptions&) {
       if (trim(in.text) != "default") {
         bad_value(in.flag,
                   "'default' (ddprun cannot load Python entry points; it writes torchrun's default layout: set "
                   "where with --log_dir and what with --redirects and --tee)",
                   in.text);
       }
     },
     "`default`"},
};

}  // namespace

std::span<const FlagDef> flag_table() { return kFlagTable; }

const FlagDef* find_flag(const std::string& spelled) {
  const std::string norm = command_line::canonical(spelled);
  for (const FlagDef& f : kFlagTable) {
    if (f.named(norm)) return &f;
  }
  return nullptr;
}

std::string abbreviated_flag(const std::string& spelled) {
  std::vector<std::string> names = {"--help", "--version"};
  for (const FlagDef& f : kFlagTable) {
    f.any_name([&](std::string_view n) {
      if (n.rfind("--", 0) == 0) names.emplace_back(n);
      return false;
    });
  }
  // A flag and its other spelling count once (--rdzv_id, --run_id), by the flag's name.
  std::vector<std::string> flags;
  for (const std::string& n : command_line::names_starting_with(spelled, names)) {
    const FlagDef* f = find_flag(n);
    const std::string name = f ? f->name : n;
    if (std::find(flags.begin(), flags.end(), name) == flags.end()) flags.push_back(name);
  }
  if (flags.size() <= 1) return flags.empty() ? "" : flags.front();
  std::string listed;
  for (size_t i = 0; i < flags.size(); ++i) {
    listed += (i == 0 ? "" : i + 1 == flags.size() ? " or " : ", ") + flags[i];
  }
  throw ConfigError("ambiguous option '" + spelled + "': it could be " + listed +
                    "; spell out more of it (see ddprun --help)");
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
