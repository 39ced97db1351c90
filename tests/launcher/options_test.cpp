#include "launcher/cli/options.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/errors.hpp"
#include "common/numbers.hpp"
#include "common/system.hpp"
#include "launcher/cli/flags.hpp"
#include "tests/launcher/options_test_support.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::launcher {

using cli::first_slurm_host;
using cli::HostFacts;
using cli::LocalRankArg;
using cli::parse_options;
using cli::rdzv_conf_keys;
using cli::RdzvBackend;
using cli::RdzvConfKey;
using cli::usage_text;
namespace {

using test_options::error_of;
using test_options::parse;

TEST(OptionsTest, AcceptsBothSpellingsAndInlineValues) {
  auto a = parse({"--nproc_per_node", "4", "--max-restarts=2", "--master-addr", "10.0.0.1", "train"});
  EXPECT_EQ(a.nproc_per_node, 4);
  EXPECT_EQ(a.max_restarts, 2);
  EXPECT_EQ(a.master_addr, "10.0.0.1");
  auto b = parse({"--nproc-per-node=3", "--run_id", "job7", "-r", "3", "-t1", "train"});
  EXPECT_EQ(b.nproc_per_node, 3);
  EXPECT_EQ(b.run_id, "job7");
  EXPECT_EQ(b.redirects.all, 3);
  EXPECT_EQ(b.tee.all, 1);
  EXPECT_EQ(parse({"--rdzv-id", "x", "p"}).run_id, "x");
}

TEST(OptionsTest, EverythingAfterTheProgramIsPassedThroughUntouched) {
  auto o = parse({"--nproc_per_node", "2", "train.py", "--nproc_per_node", "9", "--lr=0.1", "${local_rank}"});
  EXPECT_EQ(o.program, "train.py");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--nproc_per_node", "9", "--lr=0.1", "${local_rank}"}));
  EXPECT_EQ(o.nproc_per_node, 2);
  auto dashed = parse({"--", "-weird-name", "x"});
  EXPECT_EQ(dashed.program, "-weird-name");
}

TEST(OptionsTest, PetEnvironmentFallbacksApplyWhenFlagsAreAbsent) {
  auto o =
      parse({"train"},
            {{"PET_NPROC_PER_NODE", "5"}, {"PET_MAX_RESTARTS", "1"}, {"PET_NO_PYTHON", "1"}, {"PET_RDZV_ID", "kube"}});
  EXPECT_EQ(o.nproc_per_node, 5);
  EXPECT_EQ(o.max_restarts, 1);
  EXPECT_TRUE(o.no_python);
  EXPECT_EQ(o.run_id, "kube");
  // A flag wins over the variable; PET_X=0 leaves a switch off.
  auto p = parse({"--nproc_per_node", "2", "train"}, {{"PET_NPROC_PER_NODE", "5"}, {"PET_STANDALONE", "0"}});
  EXPECT_EQ(p.nproc_per_node, 2);
  EXPECT_FALSE(p.standalone);
  EXPECT_NE(error_of({"train"}, {{"PET_MAX_RESTARTS", "lots"}}).find("PET_MAX_RESTARTS: expected"), std::string::npos);
}

TEST(OptionsTest, DdprunAndTorchelasticVariablesAreReadByTheParserUnderOneRule) {
  const auto d = parse({"train"});
  EXPECT_EQ(d.step_rates_period, std::chrono::seconds(10));
  EXPECT_FALSE(d.file_timer);
  const auto o = parse({"train"}, {{"DDPRUN_STEP_RATES_PERIOD", "2.5"},
                                   {"DDPRUN_PROGRESS_INTERVAL", "3"},
                                   {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"},
                                   {"TORCHELASTIC_TIMER_FILE", "/tmp/t"}});
  EXPECT_EQ(o.step_rates_period, std::chrono::milliseconds(2500));
  EXPECT_EQ(o.progress_interval, std::chrono::seconds(3));
  EXPECT_TRUE(o.file_timer);
  EXPECT_EQ(o.timer_file, "/tmp/t");
  EXPECT_FALSE(parse({"train"}, {{"TORCHELASTIC_ENABLE_FILE_TIMER", "0"}}).file_timer);
  // A malformed value is an error that names the variable, as for every other setting.
  for (const std::string bad : {"0.1", "fast", "10s", "nan", "1e9"}) {
    EXPECT_NE(error_of({"train"}, {{"DDPRUN_STEP_RATES_PERIOD", bad}})
                  .find("DDPRUN_STEP_RATES_PERIOD: expected seconds from 0.5 to 3600 (default 10), got '" + bad + "'"),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(error_of({"train"}, {{"DDPRUN_PROGRESS_INTERVAL", "soon"}}).find("DDPRUN_PROGRESS_INTERVAL: expected"),
            std::string::npos);
}

TEST(NumbersTest, TheWholeTextIsTheNumber) {
  EXPECT_EQ(to_int("42"), 42);
  EXPECT_EQ(to_int("+42"), 42);
  EXPECT_EQ(to_int("-7"), -7);
  EXPECT_EQ(to_int("9223372036854775807"), INT64_MAX);
  for (const char* no : {"", " 1", "1 ", "12abc", "0x10", "+", "++1", "+-1", "1.5", "9223372036854775808"}) {
    EXPECT_FALSE(to_int(no).has_value()) << "'" << no << "'";
  }
  EXPECT_EQ(to_uint("18446744073709551615"), UINT64_MAX);
  EXPECT_FALSE(to_uint("-1").has_value()) << "no wrap-around";
  EXPECT_FALSE(to_uint("-0").has_value());
  EXPECT_EQ(to_double("1.5"), 1.5);
  EXPECT_EQ(to_double("2e3"), 2000.0);
  EXPECT_EQ(to_double("+0.5"), 0.5);
  for (const char* no : {"", "inf", "nan", "1.5s", " 1", "0x1p3", "+-1", "1e999"}) {
    EXPECT_FALSE(to_double(no).has_value()) << "'" << no << "'";
  }
}

TEST(OptionsTest, NprocPerNodeKeywords) {
  EXPECT_EQ(parse({"--nproc_per_node", "cpu", "t"}, {}, {6, 0}).nproc_per_node, 6);
  EXPECT_EQ(parse({"--nproc_per_node", "auto", "t"}, {}, {6, 0}).nproc_per_node, 6);
  EXPECT_EQ(parse({"--nproc_per_node", "auto", "t"}, {}, {6, 4}).nproc_per_node, 4);
  EXPECT_EQ(parse({"--nproc_per_node", "gpu", "t"}, {}, {6, 2}).nproc_per_node, 2);
  EXPECT_NE(error_of({"--nproc_per_node", "gpu", "t"}, {}, {6, 0}).find("no GPU is visible"), std::string::npos);
}

TEST(OptionsTest, BadValuesNameTheFlagAndTheAcceptedValues) {
  EXPECT_EQ(error_of({"--nproc_per_node", "x", "t"}),
            "--nproc_per_node: expected a positive number, 'auto', 'cpu', 'gpu', 'cuda' or 'xpu', got 'x'");
  EXPECT_EQ(error_of({"--nproc_per_node", "0", "t"}),
            "--nproc_per_node: expected a positive number, 'auto', 'cpu', 'gpu', 'cuda' or 'xpu', got '0'");
  EXPECT_NE(error_of({"--master_port", "70000", "t"}).find("--master_port: expected a port from 0 to 65535"),
            std::string::npos);
  EXPECT_NE(error_of({"--redirects", "7", "t"}).find("--redirects: expected 0 (none)"), std::string::npos);
  EXPECT_NE(error_of({"--signals_to_handle", "SIGNOPE", "t"}).find("--signals_to_handle"), std::string::npos);
  EXPECT_NE(error_of({"--signals_to_handle", "SIGKILL", "t"}).find("not SIGKILL"), std::string::npos);
  EXPECT_EQ(error_of({"--bogus", "t"}), "unknown option '--bogus' (see ddprun --help for the list)");
  EXPECT_NE(error_of({"--nnodes", "2", "--node_rank", "2", "t"}).find("from 0 to 1"), std::string::npos);
  EXPECT_NE(error_of({"--no_python", "-m", "t"}).find("cannot be combined"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node", "2"}).find("missing the program"), std::string::npos);
  EXPECT_NE(error_of({"--max_restarts"}).find("--max_restarts needs a value"), std::string::npos);
  EXPECT_NE(error_of({"--shutdown_timeout", "-1", "t"}).find("seconds >= 0"), std::string::npos);
}

TEST(OptionsTest, NoRestartExitCodesAreAListOf93ByDefault) {
  EXPECT_EQ(parse({"t"}).no_restart_exit_codes, (std::vector<int>{93}));
  EXPECT_EQ(parse({"--no_restart_exit_codes", "93, 42", "t"}).no_restart_exit_codes, (std::vector<int>{93, 42}));
  EXPECT_TRUE(parse({"--no_restart_exit_codes", "none", "t"}).no_restart_exit_codes.empty());
  for (const char* bad : {"0", "256", "93,x", ""}) {
    EXPECT_NE(error_of({"--no_restart_exit_codes", bad, "t"})
                  .find(std::string("--no_restart_exit_codes: expected exit codes from 1 to 255, comma-separated, or "
                                    "none, got '") +
                        bad + "'"),
              std::string::npos)
        << bad;
  }
}

TEST(OptionsTest, HealthChecksAndTheNoProgressStop) {
  const cli::LaunchOptions d = parse({"t"});
  EXPECT_EQ(d.max_no_progress_restarts, 3);
  EXPECT_EQ(d.iterations_file, "");
  EXPECT_EQ(d.node_check, "");
  EXPECT_EQ(d.node_check_timeout, std::chrono::seconds(60));
  EXPECT_TRUE(d.check_free_space.empty() && d.check_interfaces.empty() && !d.check_gpus);
  const cli::LaunchOptions o =
      parse({"--node_check", "nvidia-smi -q | grep -q 'Pending : No'", "--node_check_timeout", "5",
             "--check_free_space", "/ckpt:10G, /tmp:512m,/x:100", "--check_interface", "eth0,ib0", "--check_gpus",
             "--max_no_progress_restarts", "0", "--iterations_file", "/ckpt/latest_checkpointed_iteration.txt", "t"});
  EXPECT_EQ(o.node_check, "nvidia-smi -q | grep -q 'Pending : No'");
  EXPECT_EQ(o.node_check_timeout, std::chrono::seconds(5));
  EXPECT_EQ(o.check_free_space,
            (std::vector<cli::FreeSpaceCheck>{{"/ckpt", 10ULL << 30}, {"/tmp", 512ULL << 20}, {"/x", 100}}));
  EXPECT_EQ(o.check_interfaces, (std::vector<std::string>{"eth0", "ib0"}));
  EXPECT_TRUE(o.check_gpus);
  EXPECT_EQ(o.max_no_progress_restarts, 0);
  EXPECT_EQ(o.iterations_file, "/ckpt/latest_checkpointed_iteration.txt");
  EXPECT_TRUE(parse({"--check_free_space", "none", "--check_interface", "none", "t"}).check_free_space.empty());
  for (const char* bad : {"/ckpt", "/ckpt:", ":10G", "/ckpt:ten", "/ckpt:-1G", "/ckpt:9999999T"}) {
    EXPECT_NE(error_of({"--check_free_space", bad, "t"})
                  .find(std::string("--check_free_space: expected PATH:SIZE pairs, comma-separated, e.g. /ckpt:10G, "
                                    "or none, got '") +
                        bad + "'"),
              std::string::npos)
        << bad;
  }
  for (const char* bad : {"", "eth0,,ib0", "../x"}) {
    EXPECT_NE(error_of({"--check_interface", bad, "t"}).find("--check_interface: expected network interface names"),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(error_of({"--max_no_progress_restarts", "-1", "t"}).find("--max_no_progress_restarts"), std::string::npos);
}

TEST(OptionsTest, TraceFileIsAPath) {
  EXPECT_EQ(parse({"t"}).trace_file, "");
  EXPECT_EQ(parse({"--trace_file", "/tmp/{host}.json", "t"}).trace_file, "/tmp/{host}.json");
  EXPECT_EQ(parse({"t"}, {{"DDPRUN_TRACE_FILE", "/tmp/t.json"}}).trace_file, "/tmp/t.json");
  EXPECT_NE(error_of({"--trace_file", " ", "t"}).find("--trace_file: expected a file path"), std::string::npos);
}

TEST(OptionsTest, HttpPortComesFromTheFlagOrTorchrunsVariable) {
  EXPECT_FALSE(parse({"t"}).http_port);
  const auto flag = parse({"--http_port", "0", "t"});
  ASSERT_TRUE(flag.http_port);
  EXPECT_EQ(*flag.http_port, 0);
  EXPECT_EQ(flag.http_port_from, "--http_port");
  const auto var = parse({"t"}, {{"TORCHELASTIC_HEALTH_CHECK_PORT", "8123"}});
  ASSERT_TRUE(var.http_port);
  EXPECT_EQ(*var.http_port, 8123);
  EXPECT_EQ(var.http_port_from, "TORCHELASTIC_HEALTH_CHECK_PORT");
  EXPECT_EQ(*parse({"--http_port", "9000", "t"}, {{"TORCHELASTIC_HEALTH_CHECK_PORT", "8123"}}).http_port, 9000);
  EXPECT_NE(error_of({"--http_port", "65536", "t"}).find("--http_port: expected a port from 0 to 65535, got '65536'"),
            std::string::npos);
  EXPECT_NE(error_of({"t"}, {{"TORCHELASTIC_HEALTH_CHECK_PORT", "web"}})
                .find("TORCHELASTIC_HEALTH_CHECK_PORT: expected a port from 0 to 65535, got 'web'"),
            std::string::npos);
}

TEST(OptionsTest, PreloadTakesModuleNamesFromTheFlagOrTheEnvironment) {
  EXPECT_EQ(parse({"--preload", "torch, numpy,torch.distributed", "t.py"}).preload,
            (std::vector<std::string>{"torch", "numpy", "torch.distributed"}));
  EXPECT_EQ(parse({"t.py"}, {{"DDPRUN_PRELOAD", "torch"}}).preload, (std::vector<std::string>{"torch"}));
  EXPECT_EQ(parse({"--preload", "numpy", "t.py"}, {{"DDPRUN_PRELOAD", "torch"}}).preload,
            (std::vector<std::string>{"numpy"}))
      << "the flag wins";
  EXPECT_TRUE(parse({"t.py"}).preload.empty());
  EXPECT_EQ(error_of({"--preload", "torch;rm", "t.py"}),
            "--preload: expected Python module names separated by commas, such as torch,numpy, got 'torch;rm'");
  EXPECT_NE(error_of({"t.py"}, {{"DDPRUN_PRELOAD", "1torch"}}).find("DDPRUN_PRELOAD: expected Python module names"),
            std::string::npos);
  EXPECT_NE(error_of({"--preload", "torch..nn", "t.py"}).find("got 'torch..nn'"), std::string::npos);
}

TEST(OptionsTest, RedirectsPerLocalRankAndRankFilter) {
  auto o = parse({"--redirects", "0:1,2:3", "--local_ranks_filter", "0,2", "t"});
  EXPECT_EQ(o.redirects.for_rank(0), 1);
  EXPECT_EQ(o.redirects.for_rank(1), 0);
  EXPECT_EQ(o.redirects.for_rank(2), 3);
  ASSERT_TRUE(o.local_ranks_filter.has_value());
  EXPECT_EQ(*o.local_ranks_filter, (std::set<int>{0, 2}));
}

TEST(OptionsTest, SignalsAndShutdownTimeout) {
  auto o = parse({"--signals_to_handle", "SIGTERM,USR1,12", "--shutdown-timeout", "2.5", "t"});
  EXPECT_EQ(o.signals_to_handle, (std::vector<int>{SIGTERM, SIGUSR1, SIGUSR2}));
  EXPECT_EQ(o.shutdown_timeout, std::chrono::milliseconds(2500));
  auto d = parse({"t"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}});
  EXPECT_EQ(d.shutdown_timeout, std::chrono::seconds(7));
  EXPECT_EQ(d.signals_to_handle, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
}

TEST(OptionsTest, MasterAddrInBracketsAndPortZeroMeansAutomatic) {
  auto o = parse({"--master_addr", "[::1]", "--master_port", "0", "t"});
  EXPECT_EQ(o.master_addr, "::1");
  EXPECT_FALSE(o.master_port.has_value());
  EXPECT_EQ(parse({"--master_port", "29500", "t"}).master_port, 29500);
  EXPECT_EQ(parse({"--master_addr", "fe80::1", "t"}).master_addr, "fe80::1");
  // An address with a port is refused, saying where the port goes (it was taken as a host name).
  EXPECT_THROW(parse({"--master_addr", "node0:29500", "t"}), ConfigError);
  EXPECT_THROW(parse({"--master_addr", "[::1]:29500", "t"}), ConfigError);
}

TEST(OptionsTest, SlurmEnvironmentSetsTheJobLayout) {
  const std::map<std::string, std::string> slurm = {{"SLURM_JOB_ID", "123456"},
                                                    {"SLURM_NNODES", "4"},
                                                    {"SLURM_NODEID", "2"},
                                                    {"SLURM_JOB_NODELIST", "gpu-node[07-10],login1"}};
  auto o = parse({"--nproc_per_node", "8", "train"}, slurm);
  EXPECT_EQ(o.max_nodes, 4);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "gpu-node07");
  EXPECT_EQ(o.master_port, 20000 + 123456 % 12000);
  EXPECT_EQ(o.run_id, "slurm-123456");
  // Explicit flags win over Slurm.
  auto explicit_layout = parse({"--nnodes", "1", "train"}, slurm);
  EXPECT_EQ(explicit_layout.max_nodes, 1);
  EXPECT_EQ(explicit_layout.run_id, "none");
  EXPECT_EQ(explicit_layout.master_addr, "127.0.0.1");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("node[3-5,9]x"), "node3x");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_EQ(first_slurm_host("rack[1,2]-n[01-02]"), "rack1-n01");
}

TEST(OptionsTest, KubeflowPetVariablesDescribeAMultiNodeJob) {
  auto o = parse({"train"}, {{"PET_NNODES", "2"},
                             {"PET_NODE_RANK", "1"},
                             {"PET_NPROC_PER_NODE", "4"},
                             {"PET_MASTER_ADDR", "job-master-0"},
                             {"PET_MASTER_PORT", "23456"}});
  EXPECT_EQ(o.max_nodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.master_addr, "job-master-0");
  EXPECT_EQ(o.master_port, 23456);
}

TEST(OptionsTest, EtcdTakesSeveralEndpointsRangesAndItsOwnSettings) {
  auto o =
      parse({"--rdzv_backend", "etcd", "--rdzv_endpoint", "10.0.0.1:2379,https://10.0.0.2:2379, 10.0.0.3", "--nnodes",
             "2:4", "--rdzv_conf",
             "key_prefix=/team-a,lease_ttl=4,etcd_user=alice,etcd_password_file=/p,etcd_ca_file=/ca.crt", "train"});
  EXPECT_EQ(o.rdzv_backend, RdzvBackend::Etcd);
  EXPECT_EQ(o.etcd.endpoints, (std::vector<std::string>{"10.0.0.1:2379", "https://10.0.0.2:2379", "10.0.0.3"}));
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.max_nodes, 4);
  EXPECT_EQ(o.etcd.prefix, "/team-a/");
  EXPECT_EQ(o.etcd.lease_ttl, std::chrono::seconds(4));
  EXPECT_EQ(o.etcd.user, "alice");
  EXPECT_EQ(o.etcd.password_file, "/p");
  EXPECT_EQ(o.etcd.ca_file, "/ca.crt");
  // torchrun's spellings of the TLS files and its protocol key
  auto t = parse({"--rdzv_backend=etcd", "--rdzv_endpoint=h1:2379,http://h2:2379", "--rdzv_conf",
                  "protocol=https,cacert=/a,cert=/b,key=/c", "train"});
  EXPECT_EQ(t.etcd.endpoints, (std::vector<std::string>{"https://h1:2379", "http://h2:2379"}));
  EXPECT_EQ(t.etcd.ca_file, "/a");
  EXPECT_EQ(t.etcd.cert_file, "/b");
  EXPECT_EQ(t.etcd.key_file, "/c");
}

// Every --rdzv_conf key torchrun 2.x accepts is honoured or accepted, never "unknown key".
TEST(OptionsTest, RdzvConfTakesEveryKeyTorchrunAccepts) {
  auto o = parse({"--rdzv_backend", "c10d", "--rdzv_endpoint", "h:29400", "--nnodes", "1:4", "--rdzv_conf",
                  "join_timeout=90,last_call_timeout=5,close_timeout=10,heartbeat_timeout=21,read_timeout=7,"
                  "is_host=false,store_type=TCP,use_libuv=1,keep_alive_interval=5",
                  "train"});
  EXPECT_EQ(o.rdzv_timeouts.join_timeout, std::chrono::seconds(90));
  EXPECT_EQ(o.rdzv_timeouts.last_call_timeout, std::chrono::seconds(5));
  EXPECT_EQ(o.rdzv_timeouts.keep_alive_max_attempt, 5);  // 21 s of 5 s keep-alives: lost after the 5th missed
  EXPECT_EQ(o.rdzv_timeouts.read_timeout, std::chrono::seconds(7));
  ASSERT_TRUE(o.rdzv_is_host.has_value());
  EXPECT_FALSE(*o.rdzv_is_host);
  EXPECT_EQ(parse({"--rdzv_conf", "timeout=30", "train"}).rdzv_timeouts.join_timeout, std::chrono::seconds(30));
  EXPECT_TRUE(
      *parse({"--rdzv_backend", "c10d", "--rdzv_endpoint", "h", "--rdzv_conf", "is_host=Yes", "t"}).rdzv_is_host);
  // static torchrun passes the node rank as rdzv_conf rank
  auto r = parse({"--nnodes", "2", "--rdzv_conf", "rank=1", "train"});
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_NE(error_of({"--nnodes", "2", "--node_rank", "0", "--rdzv_conf", "rank=1", "train"}).find("keep one"),
            std::string::npos);
  // torchrun's etcd-v2 spellings of the TLS files and the prefix
  auto e = parse({"--rdzv_backend=etcd", "--rdzv_endpoint=h1:2379", "--rdzv_conf",
                  "ssl_cert=/b,ssl_cert_key=/c,ca_cert=/a,etcd_prefix=/p", "train"});
  EXPECT_EQ(e.etcd.ca_file, "/a");
  EXPECT_EQ(e.etcd.cert_file, "/b");
  EXPECT_EQ(e.etcd.key_file, "/c");
  EXPECT_EQ(e.etcd.prefix, "/p/");
  // what cannot be honoured says so
  EXPECT_NE(error_of({"--rdzv_conf", "store_type=file", "train"}).find("'tcp'"), std::string::npos);
  EXPECT_NE(error_of({"--rdzv_conf", "is_host=maybe", "train"}).find("a boolean"), std::string::npos);
  // a typo of a known key is an error that names it; any other key is ignored, as torchrun does
  // (Kubeflow passes PET_RDZV_CONF through as the user wrote it)
  const std::string unknown = error_of({"--rdzv_conf", "jion_timeout=5", "train"});
  EXPECT_NE(unknown.find("unknown key 'jion_timeout': did you mean 'join_timeout'?"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("heartbeat_timeout"), std::string::npos) << unknown;
  EXPECT_NE(error_of({"--rdzv_conf", "heartbeat_timout=5", "train"}).find("'heartbeat_timeout'"), std::string::npos);
  EXPECT_NE(error_of({"--rdzv_conf", "rnak=1", "train"}).find("did you mean 'rank'"), std::string::npos);
  auto ignored = parse({"--rdzv_conf", "join_timeout=90,kubeflow_extra=1,timeout_seconds_x=3", "train"});
  EXPECT_EQ(ignored.rdzv_timeouts.join_timeout, std::chrono::seconds(90));
  EXPECT_EQ(ignored.ignored_rdzv_conf, (std::vector<std::string>{"kubeflow_extra", "timeout_seconds_x"}));
  // --help lists every key
  const std::string help = usage_text();
  for (const RdzvConfKey& k : rdzv_conf_keys()) EXPECT_NE(help.find(k.name), std::string::npos) << k.name;
}

// c10d's is_host: the endpoint names this machine by its host name or by any interface's address
// (a Kubernetes pod named in the endpoint, a node reached on a second network).
TEST(OptionsTest, AnEndpointNamesThisMachineByHostNameOrAnyInterfaceAddress) {
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  EXPECT_TRUE(names_this_machine(name)) << name;
  EXPECT_TRUE(names_this_machine("localhost"));
  EXPECT_TRUE(names_this_machine("127.0.0.1"));
  ifaddrs* interfaces = nullptr;
  ASSERT_EQ(::getifaddrs(&interfaces), 0);
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    EXPECT_TRUE(names_this_machine(text)) << text << " of interface " << i->ifa_name;
  }
  ::freeifaddrs(interfaces);
  EXPECT_FALSE(names_this_machine("192.0.2.77"));  // TEST-NET-1: nobody's
  EXPECT_FALSE(names_this_machine(""));
}

// torchrun's newest flags: each with its meaning in ddprun, or an error that says what ddprun does.
TEST(OptionsTest, TheNewestTorchrunFlagsAreAcceptedWithTheirMeaning) {
  auto r = parse({"--run-path", "--no-python", "/abs/train_script", "--lr", "1"});
  EXPECT_TRUE(r.run_path);
  EXPECT_FALSE(r.no_python) << "--run-path takes precedence over --no-python, as in torchrun";
  EXPECT_NE(error_of({"--run_path", "-m", "pkg.train"}).find("cannot be combined"), std::string::npos);
  EXPECT_TRUE(parse({"train"}, {{"PET_RUN_PATH", "1"}}).run_path);

  EXPECT_EQ(error_of({"--event-log-handler", "null", "train"}), "");
  EXPECT_EQ(error_of({"--event_log_handler=console", "train"}), "");
  EXPECT_NE(error_of({"--event-log-handler", "scuba", "train"}).find("--report_file"), std::string::npos);
  EXPECT_EQ(error_of({"--logs-specs", "default", "train"}), "");
  EXPECT_NE(error_of({"--logs-specs", "my_specs", "train"}).find("--log_dir"), std::string::npos);

  auto filtered =
      parse({"--duplicate-stdout-filters", "loss,,acc,step", "--duplicate_stderr_filters=NCCL WARN", "train"});
  EXPECT_EQ(filtered.duplicate_stdout_filters, (std::vector<std::string>{"loss,acc", "step"}));
  EXPECT_EQ(filtered.duplicate_stderr_filters, (std::vector<std::string>{"NCCL WARN"}));
  EXPECT_NE(error_of({"--duplicate-stdout-filters", ",", "train"}).find("substrings"), std::string::npos);

  HostFacts intel{8, 0};
  intel.xpu_count = 2;
  EXPECT_EQ(parse({"--nproc-per-node", "xpu", "train"}, {}, intel).nproc_per_node, 2);
  EXPECT_NE(error_of({"--nproc-per-node", "xpu", "train"}).find("no Intel GPU"), std::string::npos);
  EXPECT_EQ(parse({"--nproc-per-node", "cuda", "train"}, {}, HostFacts{8, 4}).nproc_per_node, 4);
}

// AMD GPUs as ROCm shows them: KFD topology nodes with SIMD units (CPU nodes have none), or the
// entries of HIP_VISIBLE_DEVICES, else ROCR_VISIBLE_DEVICES; 'gpu', 'cuda' and 'auto' count them on
// a host without NVIDIA devices, and --virtual_local_rank then uses HIP_VISIBLE_DEVICES.
TEST(OptionsTest, EtcdMistakesAreNamed) {
  EXPECT_NE(error_of({"--rdzv_backend", "etcd-v2", "--rdzv_endpoint", "h:2379", "train"}).find("v3 API"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend", "etcd", "train"}).find("needs --rdzv_endpoint"), std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend", "etcd", "--rdzv_endpoint", "h:99999", "train"}).find("--rdzv_endpoint"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend", "etcd", "--rdzv_endpoint", "h:2379", "--rdzv_conf", "lease_ttl=1", "train"})
                .find("lease_ttl"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend", "etcd", "--rdzv_endpoint", "h:2379", "--rdzv_conf", "etcd_user=bob", "train"})
                .find("etcd_password_file"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend", "etcd", "--rdzv_endpoint", "h:2379", "--rdzv_conf", "protocol=ftp", "train"})
                .find("http or https"),
            std::string::npos);
  // an etcd setting without the etcd backend is a mistake, not silently ignored
  const std::string misplaced =
      error_of({"--rdzv_backend", "c10d", "--rdzv_endpoint", "h:29400", "--rdzv_conf", "lease_ttl=5", "train"});
  EXPECT_NE(misplaced.find("an etcd setting"), std::string::npos) << misplaced;
  EXPECT_NE(misplaced.find("--rdzv_backend etcd"), std::string::npos) << misplaced;
}

TEST(OptionsTest, TorchDistributedLaunchFlags) {
  EXPECT_EQ(parse({"--local_rank_arg", "train.py"}).local_rank_arg, LocalRankArg::Underscore);
  EXPECT_EQ(parse({"--local-rank-arg", "train.py"}).local_rank_arg, LocalRankArg::Underscore);
  EXPECT_EQ(parse({"--local_rank_arg=underscore", "train.py"}).local_rank_arg, LocalRankArg::Underscore);
  EXPECT_EQ(parse({"--local_rank_arg=dash", "train.py"}).local_rank_arg, LocalRankArg::Dash);
  // Without '=', the next word is the program, not the flag's value.
  EXPECT_EQ(parse({"--local_rank_arg", "dash"}).program, "dash");
  EXPECT_NE(error_of({"--local_rank_arg=minus", "train.py"}).find("'dash'"), std::string::npos);
  EXPECT_NE(error_of({"--no_python=1", "train.py"}).find("takes no value"), std::string::npos);
  EXPECT_EQ(parse({"--use_env", "train.py"}).local_rank_arg, LocalRankArg::None);
  EXPECT_EQ(parse({"train.py"}).local_rank_arg, LocalRankArg::None);
  EXPECT_NE(error_of({"--local_rank_arg", "--use_env", "train.py"}).find("contradict"), std::string::npos);
}

}  // namespace
}  // namespace ddprun::launcher
