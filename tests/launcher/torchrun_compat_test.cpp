// What torchrun's newest releases and Kubernetes ask of a launcher, end to end with real workers:
// the duplicate filters, merged lines, --run-path, LOGLEVEL, endpoints whose names resolve late, the
// health endpoint. DDPRUN_TEST_DDPRUN_BIN runs them against another build (tests/support/ddprun_bin.hpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/raw_socket.hpp"
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

}  // namespace
}  // namespace ddprun::test
