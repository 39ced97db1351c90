// --numa_binding's mapping against topology fixtures: a sysfs tree written here (two sockets, four
// NUMA nodes, hyperthreads, two last-level caches per node, eight NVIDIA GPUs, an unrelated PCI
// device), read by read_topology and placed by place_ranks in every mode, for GPU and CPU workers,
// with CUDA_VISIBLE_DEVICES and a restricted affinity (a Slurm allocation).
#include "launcher/workers/numa.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "common/errors.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::launcher {

using workers::CpuInfo;
using workers::format_cpu_list;
using workers::GpuMaker;
using workers::NumaBinding;
using workers::parse_cpu_list;
using workers::parse_numa_binding;
using workers::place_ranks;
using workers::RankPlacement;
using workers::read_topology;
using workers::Topology;
using workers::visible_gpus;
using workers::visible_gpus_of;
namespace {

namespace fs = std::filesystem;

void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

// 32 CPUs: NUMA node n (0..3) has physical cores 4n..4n+3, whose hyperthread siblings are
// 16+4n..16+4n+3; nodes 0-1 are socket 0, nodes 2-3 socket 1; each node has two L3 complexes of
// two cores. GPU g (0..7) is at 0000:<0x10+g>:00.0 on NUMA node g/2, with UUID GPU-000g-....
struct Fixture {
  test::TempDir root;
  Fixture() {
    const fs::path sys = root.path / "sys";
    for (int n = 0; n < 4; ++n) {
      const std::string first = std::to_string(4 * n) + "-" + std::to_string(4 * n + 3);
      const std::string second = std::to_string(16 + 4 * n) + "-" + std::to_string(16 + 4 * n + 3);
      put(sys / "devices/system/node" / ("node" + std::to_string(n)) / "cpulist", first + "," + second);
    }
    put(sys / "devices/system/node/possible", "0-3");
    for (int c = 0; c < 32; ++c) {
      const int core = c % 16, node = core / 4;
      const fs::path dir = sys / "devices/system/cpu" / ("cpu" + std::to_string(c));
      put(dir / "topology/physical_package_id", std::to_string(node / 2));
      put(dir / "topology/thread_siblings_list", std::to_string(core) + "," + std::to_string(core + 16));
      const int ccx = core / 2 * 2;  // cores {0,1}, {2,3}, ... share an L3
      put(dir / "cache/index0/type", "Data");
      put(dir / "cache/index0/level", "1");
      put(dir / "cache/index0/shared_cpu_list", std::to_string(core) + "," + std::to_string(core + 16));
      put(dir / "cache/index1/type", "Instruction");
      put(dir / "cache/index1/level", "1");
      put(dir / "cache/index1/shared_cpu_list", std::to_string(core));
      put(dir / "cache/index3/type", "Unified");
      put(dir / "cache/index3/level", "3");
      put(dir / "cache/index3/shared_cpu_list", std::to_string(ccx) + "-" + std::to_string(ccx + 1) + "," +
                                                    std::to_string(ccx + 16) + "-" + std::to_string(ccx + 17));
    }
    for (int g = 7; g >= 0; --g) {  // written out of order: PCI order is the address's
      char addr[32];
      std::snprintf(addr, sizeof addr, "0000:%02x:00.0", 0x10 + g);
      const fs::path dev = sys / "bus/pci/devices" / addr;
      put(dev / "vendor", "0x10de");
      put(dev / "class", g % 2 ? "0x030200" : "0x030000");
      put(dev / "numa_node", std::to_string(g / 2));
      put(root.path / "proc/driver/nvidia/gpus" / addr / "information",
          "Model: Test GPU\nGPU UUID: GPU-000" + std::to_string(g) + "-aaaa-bbbb\nBus Location: " + addr);
    }
    put(sys / "bus/pci/devices/0000:05:00.0/vendor", "0x8086");  // a NIC
    put(sys / "bus/pci/devices/0000:05:00.0/class", "0x020000");
    put(sys / "bus/pci/devices/0000:05:00.0/numa_node", "0");
    put(sys / "bus/pci/devices/0000:11:00.1/vendor", "0x10de");  // a GPU's audio function
    put(sys / "bus/pci/devices/0000:11:00.1/class", "0x040300");
    put(sys / "bus/pci/devices/0000:11:00.1/numa_node", "0");
    // Two AMD Instinct GPUs (display controllers) on nodes 3 and 1, and an Intel data-center GPU on node 2.
    for (const auto& [addr, vendor, node] :
         {std::tuple{"0000:41:00.0", "0x1002", "1"}, std::tuple{"0000:40:00.0", "0x1002", "3"},
          std::tuple{"0000:50:00.0", "0x8086", "2"}}) {
      put(sys / "bus/pci/devices" / addr / "vendor", vendor);
      put(sys / "bus/pci/devices" / addr / "class", "0x038000");
      put(sys / "bus/pci/devices" / addr / "numa_node", node);
    }
  }
  Topology read(std::set<int> allowed = {}, GpuMaker maker = GpuMaker::Nvidia) const {
    if (allowed.empty()) {
      for (int c = 0; c < 32; ++c) allowed.insert(c);
    }
    return read_topology(root.str(), allowed, maker);
  }
};

std::set<int> cpus(const std::string& list) { return parse_cpu_list(list).value(); }

std::vector<int> all_gpus(const Topology& t) { return visible_gpus(t, std::nullopt, nullptr).value(); }

// 8 ranks on the fixture's machine, each given all its GPUs to choose from.
std::vector<RankPlacement> eight_gpu_ranks(NumaBinding mode) {
  Fixture f;
  const Topology t = f.read();
  return place_ranks(t, mode, 8, all_gpus(t));
}

TEST(NumaTest, CpuListsParseAndPrintAsTheKernelWritesThem) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::set<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(parse_cpu_list(""), std::set<int>{});
  EXPECT_FALSE(parse_cpu_list("3-1"));
  EXPECT_FALSE(parse_cpu_list("a"));
  EXPECT_FALSE(parse_cpu_list("1-"));
  EXPECT_EQ(parse_numa_binding("core-complex"), NumaBinding::CoreComplex);
  EXPECT_FALSE(parse_numa_binding("numa"));
}

TEST(NumaTest, TheTopologyIsReadFromSysfs) {
  Fixture f;
  const Topology t = f.read();
  ASSERT_EQ(t.cpus.size(), 32u);
  const CpuInfo& c = t.cpus[21];  // core 5: node 1, socket 0, sibling of 5, L3 of cores 4-5
  EXPECT_EQ(c.id, 21);
  EXPECT_EQ(c.numa_node, 1);
  EXPECT_EQ(c.package, 0);
  EXPECT_EQ(c.core, 5);
  EXPECT_EQ(c.cache, 4);
  EXPECT_EQ(t.cpus[31].package, 1);
  ASSERT_EQ(t.gpus.size(), 8u);  // the NIC and the audio function are no GPUs
  EXPECT_EQ(t.gpus[0].pci_address, "0000:10:00.0");
  EXPECT_EQ(t.gpus[7].pci_address, "0000:17:00.0");
  EXPECT_EQ(t.gpus[5].numa_node, 2);
  EXPECT_EQ(t.gpus[3].uuid, "GPU-0003-aaaa-bbbb");
}

TEST(NumaTest, NodeBindsEachGpuWorkerToItsGpusNumaNode) {
  const auto p = eight_gpu_ranks(NumaBinding::Node);
  ASSERT_EQ(p.size(), 8u);
  EXPECT_EQ(p[0].cpus, cpus("0-3,16-19"));
  EXPECT_EQ(p[3].cpus, cpus("4-7,20-23"));
  EXPECT_EQ(p[7].cpus, cpus("12-15,28-31"));
  EXPECT_EQ(p[7].numa_node, 3);
  EXPECT_EQ(p[7].near, "GPU 7 (0000:17:00.0)");
  EXPECT_EQ(p[0].threads, 2);  // 4 physical cores shared by 2 ranks
}

TEST(NumaTest, SocketBindsToEveryNodeOfTheGpusSocket) {
  const auto p = eight_gpu_ranks(NumaBinding::Socket);
  EXPECT_EQ(p[2].cpus, cpus("0-7,16-23"));
  EXPECT_EQ(p[5].cpus, cpus("8-15,24-31"));
  EXPECT_EQ(p[5].numa_node, 2);
  EXPECT_EQ(p[5].threads, 2);  // 8 cores, 4 ranks
}

TEST(NumaTest, ExclusiveSplitsTheNodesPhysicalCoresWithTheirHyperthreads) {
  const auto p = eight_gpu_ranks(NumaBinding::Exclusive);
  EXPECT_EQ(p[0].cpus, cpus("0-1,16-17"));
  EXPECT_EQ(p[1].cpus, cpus("2-3,18-19"));
  EXPECT_EQ(p[6].cpus, cpus("12-13,28-29"));
  EXPECT_EQ(p[0].threads, 2);
}

TEST(NumaTest, CoreComplexGivesEachRankItsOwnLastLevelCache) {
  const auto p = eight_gpu_ranks(NumaBinding::CoreComplex);
  EXPECT_EQ(p[0].cpus, cpus("0-1,16-17"));
  EXPECT_EQ(p[1].cpus, cpus("2-3,18-19"));
  EXPECT_EQ(p[2].cpus, cpus("4-5,20-21"));
}

TEST(NumaTest, CudaVisibleDevicesChoosesTheGpusByIndexOrUuid) {
  Fixture f;
  const Topology t = f.read();
  std::string why;
  EXPECT_EQ(visible_gpus(t, std::string("6,7"), &why), (std::vector<int>{6, 7}));
  EXPECT_EQ(visible_gpus(t, std::string("GPU-0005,GPU-0002-aaaa-bbbb"), &why), (std::vector<int>{5, 2}));
  EXPECT_EQ(visible_gpus(t, std::string(""), &why), std::vector<int>{});
  EXPECT_EQ(visible_gpus(t, std::string("1,-1,2"), &why), std::vector<int>{1});  // CUDA stops at -1
  EXPECT_FALSE(visible_gpus(t, std::string("MIG-1234"), &why));
  EXPECT_NE(why.find("MIG-1234"), std::string::npos);
  EXPECT_FALSE(visible_gpus(t, std::string("9"), &why));
  // Local rank 0 uses GPU 6: node 3, sharing it with GPU 7 (exclusive halves the node).
  const auto p = place_ranks(t, NumaBinding::Exclusive, 2, {6, 7});
  EXPECT_EQ(p[0].cpus, cpus("12-13,28-29"));
  EXPECT_EQ(p[1].cpus, cpus("14-15,30-31"));
}

// AMD and Intel GPUs: their own PCI vendor ids, the "display controller" class their data-center
// parts have, and each runtime's visibility variables (ROCr's list first, HIP's indexing into it).
TEST(NumaTest, AmdAndIntelGpusArePlacedByTheirPciNodeAndTheirRuntimesVariables) {
  Fixture f;
  std::map<std::string, std::string> env;
  const auto lookup = [&env](const std::string& name) -> std::optional<std::string> {
    if (auto it = env.find(name); it != env.end()) return it->second;
    return std::nullopt;
  };
  std::string why;
  const Topology amd = f.read({}, GpuMaker::Amd);
  ASSERT_EQ(amd.gpus.size(), 2u);
  EXPECT_EQ(amd.gpus[0].pci_address, "0000:40:00.0");  // PCI order
  EXPECT_EQ(amd.gpus[0].numa_node, 3);
  EXPECT_EQ(amd.gpus[1].numa_node, 1);
  EXPECT_EQ(visible_gpus_of(amd, GpuMaker::Amd, lookup, &why), (std::vector<int>{0, 1}));
  env["HIP_VISIBLE_DEVICES"] = "1";
  EXPECT_EQ(visible_gpus_of(amd, GpuMaker::Amd, lookup, &why), std::vector<int>{1});
  env["ROCR_VISIBLE_DEVICES"] = "1";
  env["HIP_VISIBLE_DEVICES"] = "0";  // the first of what ROCr shows: GPU 1
  EXPECT_EQ(visible_gpus_of(amd, GpuMaker::Amd, lookup, &why), std::vector<int>{1});
  env["HIP_VISIBLE_DEVICES"] = "1";  // ROCr shows one GPU only
  EXPECT_FALSE(visible_gpus_of(amd, GpuMaker::Amd, lookup, &why));
  EXPECT_NE(why.find("HIP_VISIBLE_DEVICES"), std::string::npos) << why;
  env.clear();
  env["CUDA_VISIBLE_DEVICES"] = "1,0";  // HIP reads it too
  EXPECT_EQ(visible_gpus_of(amd, GpuMaker::Amd, lookup, &why), (std::vector<int>{1, 0}));
  const auto p = place_ranks(amd, NumaBinding::Node, 2, {1, 0});
  EXPECT_EQ(p[0].numa_node, 1);
  EXPECT_EQ(p[0].cpus, cpus("4-7,20-23"));
  EXPECT_EQ(p[1].numa_node, 3);

  const Topology intel = f.read({}, GpuMaker::Intel);
  ASSERT_EQ(intel.gpus.size(), 1u) << "the Intel NIC is no GPU";
  EXPECT_EQ(intel.gpus[0].numa_node, 2);
  env.clear();
  env["ZE_AFFINITY_MASK"] = "0.0,0.1";  // two tiles of GPU 0: a device each
  EXPECT_EQ(visible_gpus_of(intel, GpuMaker::Intel, lookup, &why), (std::vector<int>{0, 0}));
  const auto q = place_ranks(intel, NumaBinding::Exclusive, 2, {0, 0});
  EXPECT_EQ(q[0].numa_node, 2);
  EXPECT_EQ(q[0].cpus, cpus("8-9,24-25"));
  EXPECT_EQ(q[1].cpus, cpus("10-11,26-27"));
  EXPECT_EQ(f.read().gpus.size(), 8u) << "NVIDIA's count is unchanged";
}

TEST(NumaTest, CpuWorkersShareTheNumaNodesOutEvenly) {
  Fixture f;
  const Topology t = f.read();
  auto p = place_ranks(t, NumaBinding::Node, 4, {});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p[r].numa_node, r);
  EXPECT_EQ(p[0].threads, 4);
  EXPECT_TRUE(p[0].near.empty());
  p = place_ranks(t, NumaBinding::Node, 2, {});  // spread: nodes 0 and 2
  EXPECT_EQ(p[1].numa_node, 2);
  p = place_ranks(t, NumaBinding::Exclusive, 8, {});
  EXPECT_EQ(p[0].cpus, cpus("0-1,16-17"));
  EXPECT_EQ(p[1].cpus, cpus("2-3,18-19"));
  EXPECT_EQ(p[2].cpus, cpus("4-5,20-21"));
  // More CPU workers than GPUs: CPU workers.
  p = place_ranks(t, NumaBinding::Node, 16, {0, 1});
  EXPECT_TRUE(p[0].near.empty());
  EXPECT_EQ(p[15].numa_node, 3);
}

TEST(NumaTest, UnevenSharesGoToTheLowestRanks) {
  Fixture f;
  const Topology t = f.read();
  const auto p = place_ranks(t, NumaBinding::Exclusive, 12, {});  // 3 ranks on each 4-core node
  EXPECT_EQ(p[0].cpus, cpus("0-1,16-17"));
  EXPECT_EQ(p[0].threads, 2);
  EXPECT_EQ(p[1].cpus, cpus("2,18"));
  EXPECT_EQ(p[2].cpus, cpus("3,19"));
  EXPECT_EQ(p[2].threads, 1);
}

TEST(NumaTest, ARestrictedAffinityIsKept) {
  Fixture f;
  // A Slurm allocation of node 1's CPUs only.
  const Topology t = f.read(cpus("4-7,20-23"));
  ASSERT_EQ(t.cpus.size(), 8u);
  auto p = place_ranks(t, NumaBinding::Exclusive, 2, {});
  EXPECT_EQ(p[0].cpus, cpus("4-5,20-21"));
  EXPECT_EQ(p[1].cpus, cpus("6-7,22-23"));
  // GPU 0 is on node 0, where nothing is allowed: said, before any worker starts.
  try {
    place_ranks(t, NumaBinding::Node, 1, {0});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("GPU 0 (0000:10:00.0) is on NUMA node 0, where ddprun may use no CPU (it "
                                         "may use 4-7,20-23)"),
              std::string::npos)
        << e.what();
  }
}

TEST(NumaTest, ExclusiveWithMoreRanksThanCoresIsAnError) {
  Fixture f;
  const Topology t = f.read();
  try {
    place_ranks(t, NumaBinding::Exclusive, 20, {});  // 5 ranks per 4-core node
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("NUMA node 0 has 4 physical core(s) ddprun may use for 5 ranks"),
              std::string::npos)
        << e.what();
  }
}

TEST(NumaTest, AMachineWithoutNumaIsOneNode) {
  test::TempDir root;
  for (int c = 0; c < 2; ++c) put(root.path / "sys/devices/system/cpu" / ("cpu" + std::to_string(c)) / "online", "1");
  put(root.path / "sys/bus/pci/devices/0000:3b:00.0/vendor", "0x10de");
  put(root.path / "sys/bus/pci/devices/0000:3b:00.0/class", "0x030200");
  put(root.path / "sys/bus/pci/devices/0000:3b:00.0/numa_node", "-1");
  const Topology t = read_topology(root.str(), {0, 1});
  ASSERT_EQ(t.cpus.size(), 2u);
  EXPECT_EQ(t.cpus[1].numa_node, 0);
  ASSERT_EQ(t.gpus.size(), 1u);
  EXPECT_EQ(t.gpus[0].numa_node, 0);
  const auto p = place_ranks(t, NumaBinding::CoreComplex, 1, {0});
  EXPECT_EQ(p[0].cpus, cpus("0-1"));
}

}  // namespace
}  // namespace ddprun::launcher
