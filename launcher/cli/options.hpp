#pragma once
// ddprun's command line: torchrun's flags (both spellings, e.g. --nproc_per_node and
// --nproc-per-node) with PET_* environment fallbacks, turned into LaunchOptions in four steps:
// tokenize argv; fill in from the environment (PET_*, each flag's other variable, then Slurm's
// layout); apply each flag's value through its row of the flag table (flags.hpp); check.
// Pure: reads only what it is given, so tests drive it with fake argv and environments. Throws
// ConfigError with a message naming the flag (as the user wrote it) and the accepted values.

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/defaults.hpp"
#include "launcher/rendezvous/join_settings.hpp"
#include "launcher/workers/numa.hpp"

namespace ddprun::launcher::cli {

using workers::NumaBinding;

// -r/--redirects and -t/--tee: 0 none, 1 stdout, 2 stderr, 3 both; per local rank as "0:1,1:3".
struct StreamSelection {
  int all = 0;
  std::map<int, int> per_rank;
  int for_rank(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
  bool any() const { return all != 0 || !per_rank.empty(); }
  bool operator==(const StreamSelection&) const = default;
};

enum class LocalRankArg { None, Underscore, Dash };

// --rdzv_backend: fixed node ranks (static), nodes that join a store without ranks (c10d), or the
// same through an etcd v3 cluster (etcd).
enum class RdzvBackend { Static, C10d, Etcd };
inline const char* rdzv_backend_name(RdzvBackend b) {
  switch (b) {
    case RdzvBackend::C10d: return "c10d";
    case RdzvBackend::Etcd: return "etcd";
    case RdzvBackend::Static: break;
  }
  return "static";
}

// Whose GPUs a job's workers use: their visibility variable (--virtual_local_rank) differs.
enum class GpuVendor { None, Nvidia, Amd, Intel };
// The variable that tells a worker of `vendor` which GPUs it sees: CUDA_VISIBLE_DEVICES,
// HIP_VISIBLE_DEVICES, ZE_AFFINITY_MASK ("" for None).
const char* gpu_visibility_variable(GpuVendor vendor);

// --check_free_space: a file system (the one holding `path`) must have `bytes` free.
struct FreeSpaceCheck {
  std::string path;
  uint64_t bytes = 0;
  bool operator==(const FreeSpaceCheck&) const = default;
};

struct LaunchOptions {
  std::string nproc_spec = "1";  // as given: a number, auto, cpu or gpu
  int nproc_per_node = 1;        // resolved
  int min_nodes = 1;
  int max_nodes = 1;
  int node_rank = 0;
  bool node_rank_given = false;  // with c10d, a rank-order hint
  std::string master_addr = "127.0.0.1";
  std::optional<uint16_t> master_port;  // unset: the kernel picks a free port
  bool standalone = false;
  RdzvBackend rdzv_backend = RdzvBackend::Static;
  std::string rdzv_endpoint;       // as given
  std::string rdzv_endpoint_host;  // parsed; empty = node 0 hosts the rendezvous store
  uint16_t rdzv_endpoint_port = defaults::kStorePort;
  std::string run_id = "none";
  std::map<std::string, std::string> rdzv_conf;
  // rdzv_conf keys ddprun does not know and that are no near-miss of one it does: ignored with a
  // warning, as torchrun ignores them (Kubeflow passes whatever the user wrote in PET_RDZV_CONF).
  std::vector<std::string> ignored_rdzv_conf;
  // rdzv_conf join_timeout, last_call_timeout, read_timeout, store_reconnect_timeout,
  // keep_alive_interval and keep_alive_max_attempt, with torchrun's defaults.
  rendezvous::Timeouts rdzv_timeouts;
  // rdzv_conf heartbeat_timeout: sets keep_alive_max_attempt once every key is read (it needs the interval).
  std::optional<std::chrono::milliseconds> heartbeat_timeout;
  std::optional<bool> rdzv_is_host;  // rdzv_conf is_host (c10d); unset: when the endpoint is this host
  // rdzv_conf token_file, else DDPRUN_TOKEN_FILE: the rendezvous store's secret (or this job's token).
  std::string token_file;
  // --rdzv_backend etcd: the client URLs (--rdzv_endpoint, comma-separated) and rdzv_conf keys.
  struct Etcd {
    std::vector<std::string> endpoints;
    std::string prefix = "/ddprun/";           // key_prefix
    std::chrono::seconds lease_ttl{10};        // lease_ttl
    std::string user;                          // etcd_user
    std::string password_file;                 // etcd_password_file
    std::string ca_file, cert_file, key_file;  // etcd_ca_file (cacert), etcd_cert_file (cert), etcd_key_file (key)
    bool operator==(const Etcd&) const = default;
  } etcd;
  int max_restarts = 0;
  // --no_restart_exit_codes: a failure whose root cause exits with one of these ends the job after
  // its attempt, whatever restarts are left (93 is NVIDIA's ft_launcher's "do not restart").
  std::vector<int> no_restart_exit_codes{93};
  // Health checks before every round (launcher/agent/node_checks.hpp): --node_check (a shell
  // command; "" none) within --node_check_timeout, and the built-in ones.
  std::string node_check;
  std::chrono::milliseconds node_check_timeout{std::chrono::seconds(60)};
  std::vector<FreeSpaceCheck> check_free_space;  // --check_free_space PATH:SIZE,...
  std::vector<std::string> check_interfaces;     // --check_interface NAME,...
  bool check_gpus = false;                       // --check_gpus: the GPUs the workers use answer nvidia-smi
  // --max_unfit_leaves: a host whose nodes left the job's run this many times unfit (a failed
  // health check, a worker's request) is not taken back; 0: always taken back.
  int max_unfit_leaves = 2;
  // --max_no_progress_restarts: this many restarts in a row that get no further than the most
  // training iterations the program reported before them end the job (exit 125); 0: never.
  int max_no_progress_restarts = 3;
  // --iterations_file: a file the program writes the training iterations it has completed to (a
  // decimal count), read with the progress pages when a failure is reported; "" none.
  std::string iterations_file;
  // --replica_group: this ddprun runs one replica group of a fault-tolerant job (launcher/ft): its
  // own world (run id "<run_id>.rg<ID>") that fails and restarts alone, and a member of the job's
  // quorum under run_id. Unset: an ordinary job.
  std::optional<int> replica_group;
  int min_replica_groups = 1;  // --min_replica_groups: the fewest groups that may train
  std::chrono::milliseconds quorum_join_timeout{std::chrono::seconds(30)};      // rdzv_conf quorum_join_timeout
  std::chrono::milliseconds quorum_heartbeat_timeout{std::chrono::seconds(5)};  // rdzv_conf quorum_heartbeat_timeout
  std::chrono::milliseconds hang_timeout{0};                                    // 0: hangs are not looked for
  // DDPRUN_PROGRESS_INTERVAL: how often long waits (rendezvous, a slow shutdown) say where they are.
  std::chrono::milliseconds progress_interval{defaults::kProgressInterval};
  // DDPRUN_STEP_RATES_PERIOD: how often the workers' step rates are published and compared.
  std::chrono::milliseconds step_rates_period{std::chrono::seconds(10)};
  // TORCHELASTIC_ENABLE_FILE_TIMER=1: serve torchelastic's file timer, at TORCHELASTIC_TIMER_FILE
  // when set (else a FIFO in ddprun's run directory).
  bool file_timer = false;
  std::string timer_file;
  double straggler_factor = 1.5;  // 0: no straggler warnings
  std::string role = "default";
  // TORCHELASTIC_ERROR_FILE of ddprun itself (a launcher or scheduler above it reads it): where the
  // root cause's error goes when the job fails, as torchrun writes it; "" none.
  std::string launcher_error_file;
  std::string log_dir;
  // --report_file / DDPRUN_REPORT_FILE: the job's end as JSON ("{host}" is this host's name); "" none.
  std::string report_file;
  StreamSelection redirects;
  StreamSelection tee;
  std::optional<std::set<int>> local_ranks_filter;
  // --http_port (or TORCHELASTIC_HEALTH_CHECK_PORT): the agent's HTTP server, with the job page,
  // /metrics and the health endpoint (agent/status_server.hpp); 0: any free port. `http_port_from`
  // is how it was given (the flag or the variable), for messages.
  std::optional<uint16_t> http_port;
  std::string http_port_from;
  // --http_allowed_hosts: names the job page may be asked under besides this host's own.
  std::vector<std::string> http_allowed_hosts;
  // --trace_file: the job as a Chrome / Perfetto trace ("{host}": this host's name); "" none.
  std::string trace_file;
  // --merge_lines: identical console lines of several ranks within this window printed once; 0: off.
  std::chrono::milliseconds merge_lines{0};
  // Lines of the workers' stdout (stderr) containing one of these also go to
  // filtered_stdout.log (filtered_stderr.log) in the attempt directory (torchrun's
  // --duplicate-stdout-filters).
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  bool no_python = false;
  bool module = false;
  bool run_path = false;  // the program is a Python script, whatever its name
  // The GPUs the workers use, for --virtual_local_rank: each vendor has its visibility variable.
  GpuVendor gpu_vendor = GpuVendor::None;
  // --preload / DDPRUN_PRELOAD: modules a per-node zygote imports once (Python programs only).
  std::vector<std::string> preload;
  // --local_rank=N (Underscore, torch.distributed.launch 1.x) or --local-rank=N (Dash, 2.x) before
  // the program's own arguments.
  LocalRankArg local_rank_arg = LocalRankArg::None;
  bool use_env = false;  // --use_env: torch.distributed.launch's "no --local_rank argument"
  std::string local_addr;
  std::vector<int> signals_to_handle{SIGTERM, SIGINT, SIGHUP, SIGQUIT};  // signal numbers
  std::chrono::milliseconds shutdown_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds kill_timeout{std::chrono::seconds(30)};  // after SIGKILL, before giving a worker up
  bool virtual_local_rank = false;
  NumaBinding numa_binding = NumaBinding::Off;  // --numa_binding
  std::string topology_root = "/";              // DDPRUN_TOPOLOGY_ROOT: where sys/ (and proc/driver/nvidia) are read
  std::string log_line_prefix = "[rank${rank}]: ";
  std::string program;
  std::vector<std::string> program_args;

  bool help = false;
  bool help_markdown = false;  // --help=markdown: the flag table for the docs
  bool version = false;

  bool operator==(const LaunchOptions&) const = default;
};

// Whether the job may span several nodes: the agents then rendezvous and watch each other.
inline bool is_multi_node(const LaunchOptions& o) { return o.max_nodes > 1 || o.rdzv_backend != RdzvBackend::Static; }

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Facts about the machine that option resolution needs (injected for tests).
struct HostFacts {
  int cpu_count = 1;
  int gpu_count = 0;            // visible GPUs (CUDA_VISIBLE_DEVICES honoured)
  int xpu_count = 0;            // visible Intel GPUs (ZE_AFFINITY_MASK honoured)
  int amd_count = 0;            // visible AMD GPUs (HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES honoured)
  bool nvidia_devices = false;  // /dev/nvidia* exist (CUDA_VISIBLE_DEVICES counts them)
};

// Parses argv (without argv[0]). Throws ConfigError.
LaunchOptions parse_options(const std::vector<std::string>& args, const EnvLookup& env, const HostFacts& host);

// The --help text: every flag with its default, wrapped to `width` columns as argparse wraps it
// (command_line::help_width: the terminal's, 80 when there is none, or COLUMNS; less 2).
std::string usage_text(size_t width = 78);

// "SIGUSR1" / "USR1" / "10" -> 10. Throws ConfigError naming `flag`.
int parse_signal(const std::string& text, const std::string& flag);

// The first host of a Slurm node list: "node[03-05,9],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

// The env lookup of the real process.
EnvLookup process_env();
HostFacts detect_host(const EnvLookup& env);
// Intel GPUs: ZE_AFFINITY_MASK's entries when set, else the render nodes under `drm_root`
// (/sys/class/drm) whose device's vendor is Intel's (0x8086).
int count_intel_gpus(const EnvLookup& env, const std::string& drm_root);
// AMD GPUs as ROCm counts them: HIP_VISIBLE_DEVICES's entries, else ROCR_VISIBLE_DEVICES's, else the
// KFD topology's nodes under `kfd_nodes` (/sys/class/kfd/kfd/topology/nodes) with SIMD units (the
// CPUs' nodes have none).
int count_amd_gpus(const EnvLookup& env, const std::string& kfd_nodes);

}  // namespace ddprun::launcher::cli
