// How many workers `--nproc_per_node gpu|xpu|auto` starts on AMD and Intel hosts, from sysfs
// fixtures as the NUMA tests read them, and which visibility variable each vendor's ranks get.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "launcher/cli/options.hpp"
#include "tests/launcher/options_test_support.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::launcher {
namespace {

using cli::HostFacts;
using cli::LaunchOptions;
using test_options::error_of;
using test_options::parse;

TEST(OptionsTest, AmdGpusAreCountedFromTheKfdTopologyOrTheirVisibilityVariables) {
  test::TempDir kfd;
  auto node = [&](const std::string& name, int simds) {
    std::filesystem::create_directories(kfd.path / name);
    std::ofstream(kfd.path / name / "properties")
        << "cpu_cores_count " << (simds ? 0 : 16) << "\nsimd_count " << simds << "\nmem_banks_count 1\n";
  };
  node("0", 0);    // the CPU
  node("1", 304);  // two MI300X-like GPUs
  node("2", 304);
  auto env_of = [](std::map<std::string, std::string> m) {
    return [m](const std::string& k) -> std::optional<std::string> {
      auto it = m.find(k);
      return it == m.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  EXPECT_EQ(cli::count_amd_gpus(env_of({}), kfd.str()), 2);
  EXPECT_EQ(cli::count_amd_gpus(env_of({{"ROCR_VISIBLE_DEVICES", "1"}}), kfd.str()), 1);
  EXPECT_EQ(cli::count_amd_gpus(env_of({{"HIP_VISIBLE_DEVICES", "0,1,2"}, {"ROCR_VISIBLE_DEVICES", "1"}}), kfd.str()),
            3);
  EXPECT_EQ(cli::count_amd_gpus(env_of({}), (kfd.path / "absent").string()), 0);

  HostFacts amd{64, 0};
  amd.amd_count = 8;
  for (const char* spec : {"gpu", "cuda", "auto"}) {
    const LaunchOptions o = parse({"--nproc-per-node", spec, "--virtual-local-rank", "train"}, {}, amd);
    EXPECT_EQ(o.nproc_per_node, 8) << spec;
    EXPECT_EQ(o.gpu_vendor, cli::GpuVendor::Amd) << spec;
  }
  EXPECT_EQ(parse({"--nproc-per-node", "2", "train"}, {}, amd).gpu_vendor, cli::GpuVendor::Amd);
  EXPECT_STREQ(cli::gpu_visibility_variable(cli::GpuVendor::Amd), "HIP_VISIBLE_DEVICES");
  HostFacts nvidia{64, 4};
  nvidia.nvidia_devices = true;
  nvidia.amd_count = 2;  // both: PyTorch's cuda devices are NVIDIA's
  EXPECT_EQ(parse({"--nproc-per-node", "gpu", "train"}, {}, nvidia).gpu_vendor, cli::GpuVendor::Nvidia);
  EXPECT_EQ(parse({"--nproc-per-node", "gpu", "train"}, {}, nvidia).nproc_per_node, 4);
  EXPECT_NE(error_of({"--nproc-per-node", "gpu", "train"}).find("no GPU is visible"), std::string::npos);
  EXPECT_EQ(parse({"--nproc-per-node", "auto", "train"}).nproc_per_node, 8);  // no GPU: the CPUs
}

// Intel GPUs as Linux shows them: render nodes whose device's vendor is 0x8086, or ZE_AFFINITY_MASK.
TEST(OptionsTest, IntelGpusAreCountedFromTheirRenderNodesOrZeAffinityMask) {
  test::TempDir drm;
  auto node = [&](const std::string& name, const std::string& vendor) {
    std::filesystem::create_directories(drm.path / name / "device");
    std::ofstream(drm.path / name / "device" / "vendor") << vendor << "\n";
  };
  node("renderD128", "0x8086");  // Intel
  node("renderD129", "0x10de");  // NVIDIA
  node("renderD130", "0x8086");
  node("card0", "0x8086");  // the same GPU's display node: not counted twice
  auto no_env = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  EXPECT_EQ(cli::count_intel_gpus(no_env, drm.str()), 2);
  auto masked = [](const std::string& k) -> std::optional<std::string> {
    return k == "ZE_AFFINITY_MASK" ? std::optional<std::string>("0.0,0.1,1") : std::nullopt;
  };
  EXPECT_EQ(cli::count_intel_gpus(masked, drm.str()), 3);
  EXPECT_EQ(cli::count_intel_gpus(no_env, (drm.path / "absent").string()), 0);
}

}  // namespace
}  // namespace ddprun::launcher
