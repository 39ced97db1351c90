// --numa_binding end to end on this machine's real topology: the workers' CPU affinity (as the
// kernel reports it in /proc/self/status), their memory policy (/proc/self/numa_maps) and
// OMP_NUM_THREADS, against the placement computed from sysfs for ddprun's own affinity.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "launcher/workers/numa.hpp"
#include "tests/support/files.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using launcher::workers::format_cpu_list;

// Each worker writes its affinity, its memory policy and OMP_NUM_THREADS to DIR/placement.RANK.
std::vector<std::string> placement_worker(const TempDir& dir) {
  return {"/bin/sh", "-c",
          "{ grep Cpus_allowed_list /proc/self/status | cut -f2; "
          "grep -m1 -o 'prefer[^ ]*' /proc/self/numa_maps || echo default; "
          "echo \"$OMP_NUM_THREADS\"; } > " +
              dir.str() + "/placement.$RANK"};
}

struct Seen {
  std::string cpus, policy, omp;
};

Seen seen(const TempDir& dir, int rank) {
  std::istringstream in(read_file(dir.path / ("placement." + std::to_string(rank))));
  Seen s;
  std::getline(in, s.cpus);
  std::getline(in, s.policy);
  std::getline(in, s.omp);
  return s;
}

TEST(NumaBindingTest, ExclusiveGivesEachWorkerItsOwnCoresAndItsShareOfThreads) {
  const auto allowed = launcher::workers::allowed_cpus();
  const launcher::workers::Topology t = launcher::workers::read_topology("/", allowed);
  std::set<int> cores;
  for (const auto& c : t.cpus) cores.insert(c.core);
  if (cores.size() < 2) GTEST_SKIP() << "needs two physical cores; this machine gives ddprun " << cores.size();
  const auto expected = launcher::workers::place_ranks(t, launcher::workers::NumaBinding::Exclusive, 2, {});
  TempDir dir;
  std::vector<std::string> argv{DDPRUN_BIN, "--nproc_per_node", "2", "--numa_binding", "exclusive"};
  for (auto& a : placement_worker(dir)) argv.push_back(a);
  Subprocess p(argv, {{"OMP_NUM_THREADS", ""}, {"CUDA_VISIBLE_DEVICES", "-1"}});
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  std::set<int> both;
  for (int r = 0; r < 2; ++r) {
    const Seen s = seen(dir, r);
    EXPECT_EQ(s.cpus, format_cpu_list(expected[r].cpus)) << "rank " << r;
    EXPECT_EQ(s.omp, std::to_string(expected[r].threads)) << "rank " << r;
    EXPECT_EQ(s.policy, "prefer:" + std::to_string(expected[r].numa_node)) << "rank " << r;
    for (int c : launcher::workers::parse_cpu_list(s.cpus).value_or(std::set<int>{})) {
      EXPECT_TRUE(both.insert(c).second) << "CPU " << c << " given to both ranks";
    }
  }
  EXPECT_NE(f.err.find("--numa_binding exclusive: local rank 1 on CPUs " + format_cpu_list(expected[1].cpus)),
            std::string::npos)
      << f.err;
}

TEST(NumaBindingTest, NodeSharesTheNodeAndKeepsTheUsersOmpNumThreads) {
  const launcher::workers::Topology t = launcher::workers::read_topology("/", launcher::workers::allowed_cpus());
  const auto expected = launcher::workers::place_ranks(t, launcher::workers::NumaBinding::Node, 2, {});
  TempDir dir;
  std::vector<std::string> argv{DDPRUN_BIN, "--nproc_per_node", "2", "--numa-binding", "node"};  // torchrun's spelling
  for (auto& a : placement_worker(dir)) argv.push_back(a);
  Subprocess p(argv, {{"OMP_NUM_THREADS", "3"}, {"CUDA_VISIBLE_DEVICES", "-1"}});
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  for (int r = 0; r < 2; ++r) {
    const Seen s = seen(dir, r);
    EXPECT_EQ(s.cpus, format_cpu_list(expected[r].cpus));
    EXPECT_EQ(s.omp, "3");
  }
}

TEST(NumaBindingTest, WithoutTheFlagWorkersKeepDdprunsAffinityAndDefaultPolicy) {
  TempDir dir;
  std::vector<std::string> argv{DDPRUN_BIN, "--nproc_per_node", "1"};
  for (auto& a : placement_worker(dir)) argv.push_back(a);
  Subprocess p(argv);
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const Seen s = seen(dir, 0);
  EXPECT_EQ(s.cpus, format_cpu_list(launcher::workers::allowed_cpus()));
  EXPECT_EQ(s.policy, "default");
}

TEST(NumaBindingTest, AnUnknownModeIsRefusedWithTheAcceptedOnes) {
  Subprocess p({DDPRUN_BIN, "--nproc_per_node", "1", "--numa_binding", "numa", "/bin/true"});
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_NE(f.err.find("node, socket, exclusive or core-complex"), std::string::npos) << f.err;
}

TEST(NumaBindingTest, MoreExclusiveRanksThanCoresIsRefusedBeforeAnyWorkerRuns) {
  const launcher::workers::Topology t = launcher::workers::read_topology("/", launcher::workers::allowed_cpus());
  std::set<int> cores;
  for (const auto& c : t.cpus) cores.insert(c.core);
  TempDir dir;
  const int too_many = static_cast<int>(cores.size()) + 1;
  Subprocess p({DDPRUN_BIN, "--nproc_per_node", std::to_string(too_many), "--numa_binding", "exclusive", "/bin/sh",
                "-c", "touch " + dir.str() + "/ran"},
               {{"CUDA_VISIBLE_DEVICES", "-1"}});
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("each needs a core of its own"), std::string::npos) << f.err;
  EXPECT_FALSE(fs::exists(dir.path / "ran"));
}

}  // namespace
}  // namespace ddprun::test
