// The machine's facts option resolution needs (options.hpp's HostFacts): CPUs, and the GPUs of each
// vendor Linux shows, with the variables that narrow what a process sees.
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>

#include "launcher/cli/options.hpp"
#include "launcher/cli/options_parse.hpp"

namespace ddprun::launcher::cli {

using options_detail::split;
using options_detail::trim;

namespace {

// The number of devices a visibility variable lists ("0,1", "0.0,0.1"), or nullopt when it is unset
// or empty.
std::optional<int> listed_devices(const EnvLookup& env, const char* var) {
  auto v = env(var);
  if (!v || trim(*v).empty()) return std::nullopt;
  int n = 0;
  for (const std::string& d : split(*v, ',')) n += d.empty() ? 0 : 1;
  return n;
}

}  // namespace

HostFacts detect_host(const EnvLookup& env) {
  HostFacts h;
  cpu_set_t set;
  CPU_ZERO(&set);
  h.cpu_count = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  int nvidia = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("nvidia", 0) == 0 && n.size() > 6 && std::all_of(n.begin() + 6, n.end(), ::isdigit)) ++nvidia;
  }
  h.nvidia_devices = nvidia > 0;
  h.gpu_count = nvidia;
  if (auto cvd = env("CUDA_VISIBLE_DEVICES")) {  // what CUDA (or HIP) shows, whatever the devices
    h.gpu_count = 0;
    for (const std::string& d : split(*cvd, ',')) {
      if (d.empty() || d == "-1" || d == "NoDevFiles") break;
      ++h.gpu_count;
    }
  }
  h.xpu_count = count_intel_gpus(env, "/sys/class/drm");
  h.amd_count = count_amd_gpus(env, "/sys/class/kfd/kfd/topology/nodes");
  return h;
}

int count_amd_gpus(const EnvLookup& env, const std::string& kfd_nodes) {
  for (const char* var : {"HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}) {
    if (auto n = listed_devices(env, var)) return *n;
  }
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kfd_nodes, ec)) {
    std::ifstream in(e.path() / "properties");
    std::string key;
    long long value = 0;
    while (in >> key >> value) {
      if (key == "simd_count") {
        if (value > 0) ++n;
        break;
      }
    }
  }
  return n;
}

const char* gpu_visibility_variable(GpuVendor vendor) {
  switch (vendor) {
    case GpuVendor::Nvidia: return "CUDA_VISIBLE_DEVICES";
    case GpuVendor::Amd: return "HIP_VISIBLE_DEVICES";
    case GpuVendor::Intel: return "ZE_AFFINITY_MASK";
    case GpuVendor::None: break;
  }
  return "";
}

int count_intel_gpus(const EnvLookup& env, const std::string& drm_root) {
  // ZE_AFFINITY_MASK: the devices Level Zero shows ("0,1", "0.0,0.1" for tiles), as CUDA_VISIBLE_DEVICES.
  if (auto n = listed_devices(env, "ZE_AFFINITY_MASK")) return *n;
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(drm_root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("renderD", 0) != 0) continue;
    std::ifstream vendor(e.path() / "device" / "vendor");
    std::string id;
    if (vendor >> id && id == "0x8086") ++n;  // Intel
  }
  return n;
}

}  // namespace ddprun::launcher::cli
