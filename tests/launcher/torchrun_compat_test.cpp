// What torchrun's newest releases, PyTorch's own launcher tests and Kubernetes ask of a launcher,
// end to end with real workers: the duplicate filters, merged lines, --run-path, LOGLEVEL, endpoints
// whose names resolve late, the health endpoint, argparse's abbreviations and --help, roles, the
// launcher's own error file. DDPRUN_TEST_DDPRUN_BIN runs them against another build
// (tests/support/ddprun_bin.hpp).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/raw_socket.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters: the matching lines of every
// rank, prefixed as on the console, also in filtered_std{out,err}.log of the attempt's directory;
// the console and the rank logs unchanged.
TEST(LauncherTest, DuplicateFiltersCopyMatchingLinesOfEveryRankIntoOneFile) {
  TempDir logs;
  Subprocess p(
      ddprun({"--nproc_per_node", "2", "--log_dir", logs.str(), "--run_id", "filters", "--duplicate-stdout-filters",
              "line 1,line 3", "--duplicate_stderr_filters", "err line 2", TEST_WORKER_BIN, "print", "4"}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  std::vector<fs::path> attempts;
  for (const auto& run : fs::directory_iterator(logs.path)) attempts.push_back(run.path() / "attempt_0");
  ASSERT_EQ(attempts.size(), 1u);
  auto lines_of = [](const fs::path& file) {
    std::multiset<std::string> lines;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) lines.insert(line);
    return lines;
  };
  EXPECT_EQ(lines_of(attempts[0] / "filtered_stdout.log"),
            (std::multiset<std::string>{"[rank0]: out line 1", "[rank0]: out line 3", "[rank1]: out line 1",
                                        "[rank1]: out line 3"}));
  EXPECT_EQ(lines_of(attempts[0] / "filtered_stderr.log"),
            (std::multiset<std::string>{"[rank0]: err line 2", "[rank1]: err line 2"}));
  for (int k = 0; k < 4; ++k) {  // the console keeps every line
    EXPECT_NE(f.out.find("[rank1]: out line " + std::to_string(k) + "\n"), std::string::npos) << f.out;
  }
}

// --merge_lines: the same line of every rank once, with the ranks; stderr too; the log files keep
// every rank's own lines.
TEST(LauncherTest, MergeLinesPrintsTheSameLineOfEveryRankOnce) {
  TempDir logs;
  Subprocess p(ddprun({"--nproc_per_node", "4", "--merge_lines=5", "--tee", "3", "--log_dir", logs.str(),
                       TEST_WORKER_BIN, "print", "2"}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.out.find("[rank0-3]: out line 0\n[rank0-3]: out line 1\n"), std::string::npos) << f.out;
  EXPECT_EQ(f.out.find("[rank1]: out line"), std::string::npos) << f.out;
  EXPECT_NE(f.err.find("[rank0-3]: err line 0\n[rank0-3]: err line 1\n"), std::string::npos) << f.err;
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(logs.path)) {
    if (e.path().filename() != "stdout.log") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str(), "out line 0\nout line 1\n") << e.path();
    ++files;
  }
  EXPECT_EQ(files, 4);
}

// torchrun's LOGLEVEL sets ddprun's log level (Python's names) when DDPRUN_LOG_LEVEL does not.
TEST(LauncherTest, TorchrunsLoglevelSetsTheLogLevelUnlessDdprunLogLevelDoes) {
  auto run = [](std::map<std::string, std::string> env) {
    Subprocess p(ddprun({"--nproc_per_node", "1", TEST_WORKER_BIN, "print", "0"}), env);
    return p.wait(30s).err;
  };
  EXPECT_NE(run({{"LOGLEVEL", "DEBUG"}, {"DDPRUN_LOG_LEVEL", ""}}).find(" DEBUG "), std::string::npos);
  const std::string warning = run({{"LOGLEVEL", "WARNING"}, {"DDPRUN_LOG_LEVEL", ""}});
  EXPECT_EQ(warning.find(" INFO "), std::string::npos) << warning;
  EXPECT_NE(run({{"LOGLEVEL", "WARNING"}, {"DDPRUN_LOG_LEVEL", "info"}}).find(" INFO "), std::string::npos);
}

// Kubernetes: a pod's DNS name resolves only once the pod is ready. An endpoint given by such a
// name is looked up again, with progress lines, until it resolves (within the join timeout). Here
// the node runs in network and mount namespaces of its own, with an /etc/hosts that names the
// endpoint only after a while.
TEST(LauncherTest, AnEndpointWhoseNameResolvesLateIsWaitedFor) {
  TempDir dir;
  const fs::path hosts = dir.path / "hosts";
  std::ofstream(hosts) << "127.0.0.1 localhost\n";
  const std::string script = "mount --bind " + hosts.string() + " /etc/hosts && ip link set lo up && exec " +
                             ddprun_bin() +
                             " --nnodes 1 --rdzv_backend c10d --rdzv_endpoint job-master-0:29411"
                             " --rdzv_conf join_timeout=60,is_host=true " TEST_WORKER_BIN " print 1";
  Subprocess p({"/usr/bin/unshare", "-m", "-n", "/bin/bash", "-c", script}, {{"DDPRUN_PROGRESS_INTERVAL", "1"}});
  if (!p.wait_for_output("still waiting for the rendezvous store at job-master-0:29411", 30s)) {
    const Finished f = p.wait(30s);
    if (f.err.find("unshare") != std::string::npos || f.err.find("mount") != std::string::npos) {
      GTEST_SKIP() << "cannot make namespaces here (needs root): " << f.err;
    }
    FAIL() << "no progress line while the name does not resolve:\n" << f.err;
  }
  std::ofstream(hosts, std::ios::app) << "127.0.0.1 job-master-0\n";  // the pod is ready
  const Finished f = p.wait(60s);
  EXPECT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.err.find("cannot resolve host"), std::string::npos) << f.err;
  EXPECT_NE(f.out.find("[rank0]: out line 0"), std::string::npos) << f.out;
}

// A port held by a listener of the test's own, for as long as it lives.
class TakenPort {
 public:
  TakenPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 1) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error(std::string("cannot hold a port: ") + std::strerror(errno));
    }
    port_ = ntohs(addr.sin_port);
  }
  ~TakenPort() { ::close(fd_); }
  TakenPort(const TakenPort&) = delete;
  TakenPort& operator=(const TakenPort&) = delete;
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// TORCHELASTIC_HEALTH_CHECK_PORT: a liveness probe's GET answers 200 while the workers run; a port
// that cannot be served is an error before anything starts.
TEST(LauncherTest, HealthCheckPortAnswersWhileTheWorkersRun) {
  const int port = free_port();
  Subprocess p(ddprun({"--nproc_per_node", "2", TEST_WORKER_BIN, "sleep", "60"}),
               {{"TORCHELASTIC_HEALTH_CHECK_PORT", std::to_string(port)}});
  std::string reply;
  EXPECT_TRUE(wait_until(
      [&] {
        try {
          RawSocket s(static_cast<uint16_t>(port));
          s.send("GET / HTTP/1.1\r\nHost: kubelet\r\n\r\n");
          reply.clear();
          s.read_until_eof(&reply);
        } catch (const std::exception&) {
          return false;
        }
        return reply.find("ok: running, 2 workers") != std::string::npos;
      },
      30s))
      << reply;
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK", 0), 0u) << reply;
  p.signal(SIGTERM);
  p.wait(30s);

  // The port is taken (by a listener of this test): ddprun says so and starts nothing.
  TakenPort taken;
  Subprocess q(ddprun({"--nproc_per_node", "1", TEST_WORKER_BIN, "sleep", "60"}),
               {{"TORCHELASTIC_HEALTH_CHECK_PORT", std::to_string(taken.port())}});
  const Finished f = q.wait(30s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("TORCHELASTIC_HEALTH_CHECK_PORT=" + std::to_string(taken.port()) +
                       ": cannot serve the job's HTTP endpoint"),
            std::string::npos)
      << f.err;
}

// torchrun's --run-path: a Python script without the .py suffix runs as __main__, its arguments
// after it, and wins over --no-python.
TEST(LauncherTest, RunPathRunsAScriptOfAnyNameAsPython) {
  TempDir dir;
  const std::string script = (dir.path / "train_entry").string();
  std::ofstream(script) << "import os, sys\n"
                           "if __name__ == '__main__':\n"
                           "    print(f'main argv={sys.argv[1:]} rank={os.environ[\"RANK\"]}')\n";
  Subprocess p(ddprun({"--nproc_per_node", "2", "--run-path", "--no-python", script, "--lr", "0.1"}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    EXPECT_NE(f.out.find("[rank" + rank + "]: main argv=['--lr', '0.1'] rank=" + rank), std::string::npos) << f.out;
  }
}

// PyTorch's test_launch_elastic, as its run_test.py passes it (from Python: the quotes are in the
// value), with this test's worker: every rank runs.
TEST(LauncherTest, PyTorchsElasticLaunchTestRuns) {
  TempDir dir;
  const int port = free_port();
  Subprocess p(ddprun(
      {"--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:" + std::to_string(port),
       "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'", "--rdzv-id=elastic-" + std::to_string(port),
       "--monitor-interval=1", "--start-method=spawn", TEST_WORKER_BIN, "env", dir.str()}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_TRUE(fs::exists(dir.path / "env.0"));
  EXPECT_TRUE(fs::exists(dir.path / "env.1"));
}

// argparse's abbreviations, as torchrun takes them: a unique prefix of a flag is the flag; a prefix
// of several is refused naming them; the program's own arguments are never looked at.
TEST(LauncherTest, AUniquePrefixOfAFlagStandsForItAsInTorchrun) {
  TempDir logs;
  Subprocess p(ddprun({"--nproc-per", "2", "--redirect=1", "--log_d", logs.str(), TEST_WORKER_BIN, "print", "1"}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(f.out.find("out line 0"), std::string::npos) << "--redirect=1 is --redirects 1: " << f.out;
  EXPECT_NE(f.err.find("[rank1]: err line 0"), std::string::npos) << f.err;
  int logs_written = 0;
  for (const auto& e : fs::recursive_directory_iterator(logs.path)) logs_written += e.path().filename() == "stdout.log";
  EXPECT_EQ(logs_written, 2);

  Subprocess ambiguous(ddprun({"--max", "1", TEST_WORKER_BIN, "print", "1"}));
  const Finished a = ambiguous.wait(30s);
  EXPECT_EQ(a.exit_code, 2) << a.err;
  EXPECT_NE(a.err.find("--max_restarts"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("--max_unfit_leaves"), std::string::npos) << a.err;
  EXPECT_EQ(a.out, "");

  Subprocess own(ddprun({"--nproc", "1", "/bin/sh", "-c", "echo \"$@\"", "sh", "--max", "--nproc"}));
  const Finished o = own.wait(30s);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("[rank0]: --max --nproc\n"), std::string::npos) << o.out;
}

// torchrun's pattern for a per-rank --redirects is (N:S,)*N:S: "0:1," is refused before anything starts.
TEST(LauncherTest, ARedirectsListWithATrailingCommaIsRefused) {
  Subprocess p(ddprun({"--nproc_per_node", "1", "--redirects", "0:1,", TEST_WORKER_BIN, "print", "1"}));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("--redirects: expected"), std::string::npos) << f.err;
  EXPECT_EQ(f.out, "");
}

// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE as torchrun 2.x expands it (Python's string.Template):
// torchrun's own default prefix spelled as a template, and PyTorch's test's "[rank${rank}]: ".
TEST(LauncherTest, TheLogLinePrefixTemplateIsExpandedAsTorchrunExpandsIt) {
  for (const auto& [tmpl, rank1] : std::vector<std::pair<std::string, std::string>>{
           {"[$role_name$local_rank]:", "[default1]:out line 0\n"}, {"[rank${rank}]: ", "[rank1]: out line 0\n"}}) {
    TempDir logs;
    Subprocess p(ddprun({"--nproc-per-node=2", "--redirects=3", "--tee=3", "--log_dir", logs.str(), TEST_WORKER_BIN,
                         "print", "1"}),
                 {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", tmpl}});
    const Finished f = p.wait(60s);
    ASSERT_EQ(f.exit_code, 0) << f.err;
    EXPECT_NE(f.out.find(rank1), std::string::npos) << tmpl << "\n" << f.out;
  }
}

// ddprun --help on a terminal of `columns` columns (COLUMNS unset).
std::string help_on_a_terminal(unsigned short columns) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) throw std::runtime_error("no pseudo-terminal");
  const std::string terminal = ::ptsname(master);
  const std::string bin = ddprun_bin();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    const int fd = ::open(terminal.c_str(), O_RDWR);
    winsize ws{};
    ws.ws_row = 40;
    ws.ws_col = columns;
    ::ioctl(fd, TIOCSWINSZ, &ws);
    ::dup2(fd, STDOUT_FILENO);
    ::unsetenv("COLUMNS");
    ::execl(bin.c_str(), bin.c_str(), "--help", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string out;
  char buf[4096];
  for (;;) {  // until the terminal closes (EIO once ddprun exited), within a deadline
    pollfd pfd{master, POLLIN, 0};
    if (::poll(&pfd, 1, 30000) <= 0) break;
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  ::waitpid(pid, nullptr, 0);
  out.erase(std::remove(out.begin(), out.end(), '\r'), out.end());  // the terminal's CR LF
  return out;
}

size_t longest_line(const std::string& text) {
  size_t longest = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) longest = std::max(longest, line.size());
  return longest;
}

// --help is wrapped as argparse wraps it: to the terminal's width, 80 columns when there is no
// terminal, COLUMNS when set (less 2 each time); --help=markdown, the docs' table, whatever the width.
TEST(LauncherTest, HelpIsWrappedToTheTerminalsWidth) {
  Subprocess piped(ddprun({"--help"}), {{"COLUMNS", ""}});
  const Finished p = piped.wait(30s);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_LE(longest_line(p.out), 78u) << p.out;
  EXPECT_GE(longest_line(p.out), 70u) << "wrapped to the width, not far inside it";
  Subprocess narrow(ddprun({"--help"}), {{"COLUMNS", "60"}});
  const Finished n = narrow.wait(30s);
  EXPECT_LE(longest_line(n.out), 58u) << n.out;
  const std::string wide = help_on_a_terminal(120);
  EXPECT_NE(wide.find("--nproc_per_node"), std::string::npos) << wide;
  EXPECT_LE(longest_line(wide), 118u) << wide;
  EXPECT_GT(longest_line(wide), 100u) << wide;
  Subprocess md60(ddprun({"--help=markdown"}), {{"COLUMNS", "60"}});
  Subprocess md200(ddprun({"--help=markdown"}), {{"COLUMNS", "200"}});
  EXPECT_EQ(md60.wait(30s).out, md200.wait(30s).out);
}

std::map<std::string, std::string> env_of(const fs::path& file) {
  std::map<std::string, std::string> env;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (const auto eq = line.find('='); eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

// Two agents of one job with different --role (docs/multi-node.md: the same --rdzv_endpoint run
// twice): ROLE_RANK and ROLE_WORLD_SIZE count within each role, as torchrun counts them.
TEST(LauncherTest, RanksWithinARoleCountThatRolesWorkersOnly) {
  TempDir dir;
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto agent = [&](const char* role, const char* nproc) {
    return ddprun({"--nnodes", "2", "--nproc_per_node", nproc, "--role", role, "--rdzv_backend", "c10d",
                   "--rdzv_endpoint", endpoint, "--rdzv_id", "roles", TEST_WORKER_BIN, "env", dir.str()});
  };
  Subprocess master(agent("master", "1"));
  Subprocess trainer(agent("trainer", "2"));
  const Finished t = trainer.wait(90s);
  const Finished m = master.wait(90s);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  ASSERT_EQ(t.exit_code, 0) << t.err;
  std::map<std::string, std::set<std::string>> role_ranks;
  for (int rank = 0; rank < 3; ++rank) {
    auto env = env_of(dir.path / ("env." + std::to_string(rank)));
    ASSERT_FALSE(env.empty()) << "rank " << rank;
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], env["ROLE_NAME"] == "master" ? "1" : "2") << env["ROLE_NAME"];
    role_ranks[env["ROLE_NAME"]].insert(env["ROLE_RANK"]);
  }
  EXPECT_EQ(role_ranks["master"], (std::set<std::string>{"0"}));
  EXPECT_EQ(role_ranks["trainer"], (std::set<std::string>{"0", "1"}));
}

// ddprun's own TORCHELASTIC_ERROR_FILE (set by a launcher or scheduler above it): the root cause's
// error file, with its exit code, as torchrun's agent copies it there; the report points at that
// copy, never at the worker's file, which went with the run directory. ddprun's own error goes
// there too.
TEST(LauncherTest, TheRootCausesErrorGoesToTheLaunchersOwnErrorFile) {
  TempDir dir;
  const fs::path own = dir.path / "launcher_error.json";
  Reports reports;
  Subprocess p(ddprun(reports.flags(0, {"--nproc_per_node", "1", TEST_WORKER_BIN, "error-file", "loss is NaN"})),
               {{"TORCHELASTIC_ERROR_FILE", own.string()}});
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 1) << f.err;
  const auto copied = read_report(own);
  ASSERT_TRUE(copied.is_object()) << f.err;
  EXPECT_EQ(copied["message"]["message"], "RuntimeError: loss is NaN") << copied.dump();
  EXPECT_EQ(copied["message"]["extraInfo"]["py_callstack"], "Traceback: train.py line 42") << copied.dump();
  EXPECT_EQ(copied["message"]["errorCode"], 1) << copied.dump();
  const auto root = reports.of(0)["root_cause"];
  ASSERT_TRUE(root.is_object()) << f.err;
  EXPECT_EQ(root["error_file"], own.string()) << root.dump(2);
  EXPECT_NE(root["error"].get<std::string>().find("loss is NaN"), std::string::npos) << root.dump(2);
  EXPECT_NE(f.err.find("error_file : " + own.string()), std::string::npos) << f.err;

  // No error file of its own: the report keeps the error's text and names no file that is gone.
  Reports alone;
  Subprocess q(ddprun(alone.flags(0, {"--nproc_per_node", "1", TEST_WORKER_BIN, "error-file", "loss is NaN"})),
               {{"TORCHELASTIC_ERROR_FILE", ""}});
  EXPECT_EQ(q.wait(30s).exit_code, 1);
  const auto kept = alone.of(0)["root_cause"];
  ASSERT_TRUE(kept.is_object());
  EXPECT_NE(kept["error"].get<std::string>().find("loss is NaN"), std::string::npos) << kept.dump(2);
  EXPECT_TRUE(kept["error_file"].is_null() || fs::exists(kept["error_file"].get<std::string>())) << kept.dump(2);

  // ddprun's own error: what main prints.
  TakenPort taken;
  Subprocess r(
      ddprun({"--nproc_per_node", "1", "--http_port", std::to_string(taken.port()), TEST_WORKER_BIN, "print", "1"}),
      {{"TORCHELASTIC_ERROR_FILE", own.string()}});
  EXPECT_EQ(r.wait(30s).exit_code, 2);
  const auto error = read_report(own);
  ASSERT_TRUE(error.is_object());
  EXPECT_NE(error["message"]["message"].get<std::string>().find("cannot serve"), std::string::npos) << error.dump();
}

}  // namespace
}  // namespace ddprun::test
