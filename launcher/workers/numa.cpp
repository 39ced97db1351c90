#include "launcher/workers/numa.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/errors.hpp"

namespace ddprun::launcher::workers {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::optional<int> to_int(std::string_view text) {
  int v = 0;
  const auto* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, v);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\n");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\n") - b + 1));
}

// A CPU list file of sysfs, or ConfigError naming it.
std::set<int> read_cpu_list(const fs::path& p) {
  const auto text = read_text(p);
  if (!text) throw ConfigError("--numa_binding: cannot read " + p.string());
  auto cpus = parse_cpu_list(*text);
  if (!cpus) throw ConfigError("--numa_binding: " + p.string() + " is not a CPU list: '" + *text + "'");
  return *cpus;
}

// The lowest CPU sharing the CPU's last-level data cache, or nullopt without cache information.
std::optional<int> last_level_cache(const fs::path& cpu_dir) {
  std::error_code ec;
  int best_level = -1;
  std::optional<int> owner;
  for (const auto& entry : fs::directory_iterator(cpu_dir / "cache", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("index", 0) != 0 || !to_int(name.substr(5))) continue;
    const auto type = read_text(entry.path() / "type");
    if (!type || (*type != "Unified" && *type != "Data")) continue;
    const auto level = read_text(entry.path() / "level");
    const auto shared = read_text(entry.path() / "shared_cpu_list");
    if (!level || !shared || !to_int(*level)) continue;
    const auto cpus = parse_cpu_list(*shared);
    if (!cpus || cpus->empty() || *to_int(*level) <= best_level) continue;
    best_level = *to_int(*level);
    owner = *cpus->begin();
  }
  return owner;
}

std::string gpu_uuid(const fs::path& root, const std::string& address) {
  std::ifstream in(root / "proc/driver/nvidia/gpus" / address / "information");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("GPU UUID:", 0) == 0) return trim(line.substr(9));
  }
  return "";
}

}  // namespace

std::optional<NumaBinding> parse_numa_binding(std::string_view text) {
  if (text == "node") return NumaBinding::Node;
  if (text == "socket") return NumaBinding::Socket;
  if (text == "exclusive") return NumaBinding::Exclusive;
  if (text == "core-complex" || text == "core_complex") return NumaBinding::CoreComplex;
  return std::nullopt;
}

std::string numa_binding_name(NumaBinding mode) {
  switch (mode) {
    case NumaBinding::Off: return "off";
    case NumaBinding::Node: return "node";
    case NumaBinding::Socket: return "socket";
    case NumaBinding::Exclusive: return "exclusive";
    case NumaBinding::CoreComplex: return "core-complex";
  }
  return "off";
}

std::optional<std::set<int>> parse_cpu_list(std::string_view text) {
  std::set<int> out;
  const std::string all = trim(text);
  std::string_view rest = all;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const auto dash = item.find('-');
    const auto lo = to_int(item.substr(0, dash));
    const auto hi = dash == std::string::npos ? lo : to_int(item.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi - *lo > (1 << 16)) return std::nullopt;
    for (int c = *lo; c <= *hi; ++c) out.insert(c);
  }
  return out;
}

std::string format_cpu_list(const std::set<int>& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    const int lo = *it;
    int hi = lo;
    for (++it; it != cpus.end() && *it == hi + 1; ++it) hi = *it;
    if (!out.empty()) out += ',';
    out += std::to_string(lo);
    if (hi != lo) out += "-" + std::to_string(hi);
  }
  return out;
}

std::set<int> allowed_cpus() {
  std::set<int> out;
  for (int size = 1024; size <= (1 << 16); size *= 2) {
    cpu_set_t* set = CPU_ALLOC(size);
    const size_t bytes = CPU_ALLOC_SIZE(size);
    const int rc = ::sched_getaffinity(0, bytes, set);
    if (rc == 0) {
      for (int c = 0; c < size; ++c) {
        if (CPU_ISSET_S(c, bytes, set)) out.insert(c);
      }
    }
    CPU_FREE(set);
    if (rc == 0 || errno != EINVAL) break;
  }
  return out;
}

Topology read_topology(const std::string& root_text, const std::set<int>& allowed, GpuMaker maker) {
  const fs::path root(root_text.empty() ? "/" : root_text);
  const fs::path sys = root / "sys";
  Topology t;
  // NUMA node of each CPU; a kernel without NUMA has no node directories: one node, 0.
  std::map<int, int> node_of;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(sys / "devices/system/node", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0) continue;
    const auto node = to_int(name.substr(4));
    if (!node) continue;
    for (int c : read_cpu_list(entry.path() / "cpulist")) node_of[c] = *node;
  }
  for (int c : allowed) {
    const fs::path dir = sys / "devices/system/cpu" / ("cpu" + std::to_string(c));
    CpuInfo cpu;
    cpu.id = c;
    cpu.numa_node = node_of.count(c) ? node_of[c] : 0;
    if (const auto pkg = read_text(dir / "topology/physical_package_id"); pkg && to_int(*pkg)) {
      cpu.package = std::max(0, *to_int(*pkg));
    }
    cpu.core = c;
    if (fs::exists(dir / "topology/thread_siblings_list")) {
      const auto siblings = read_cpu_list(dir / "topology/thread_siblings_list");
      if (!siblings.empty()) cpu.core = *siblings.begin();
    }
    cpu.cache = last_level_cache(dir).value_or(-1);
    t.cpus.push_back(cpu);
  }
  // Without cache information a NUMA node is one complex.
  std::map<int, int> first_of_node;
  for (const CpuInfo& c : t.cpus) first_of_node.emplace(c.numa_node, c.id);
  for (CpuInfo& c : t.cpus) {
    if (c.cache < 0) c.cache = first_of_node[c.numa_node];
  }
  for (const auto& entry : fs::directory_iterator(sys / "bus/pci/devices", ec)) {
    const auto vendor = read_text(entry.path() / "vendor");
    const auto cls = read_text(entry.path() / "class");
    const char* vendor_id = maker == GpuMaker::Amd ? "0x1002" : maker == GpuMaker::Intel ? "0x8086" : "0x10de";
    if (!vendor || *vendor != vendor_id || !cls) continue;
    // VGA, 3D or (AMD Instinct, Intel's data-center GPUs) display controller.
    if (cls->rfind("0x0300", 0) != 0 && cls->rfind("0x0302", 0) != 0 && cls->rfind("0x0380", 0) != 0) continue;
    GpuInfo g;
    g.pci_address = entry.path().filename().string();
    if (const auto n = read_text(entry.path() / "numa_node"); n && to_int(*n)) g.numa_node = std::max(0, *to_int(*n));
    g.uuid = gpu_uuid(root, g.pci_address);
    t.gpus.push_back(std::move(g));
  }
  std::sort(t.gpus.begin(), t.gpus.end(),
            [](const GpuInfo& a, const GpuInfo& b) { return a.pci_address < b.pci_address; });
  return t;
}

std::optional<std::vector<int>> visible_gpus(const Topology& t, const std::optional<std::string>& cuda_visible_devices,
                                             std::string* why, const std::string& variable) {
  std::vector<int> out;
  if (!cuda_visible_devices) {
    for (size_t i = 0; i < t.gpus.size(); ++i) out.push_back(static_cast<int>(i));
    return out;
  }
  std::string_view rest = *cuda_visible_devices;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const auto dot = item.find('.');
    if (const auto index = to_int(dot == std::string::npos ? item : item.substr(0, dot))) {
      if (*index < 0) break;  // CUDA stops at an invalid entry
      if (*index >= static_cast<int>(t.gpus.size())) {
        if (why) *why = variable + " names GPU " + item + ", but sysfs shows " + std::to_string(t.gpus.size());
        return std::nullopt;
      }
      out.push_back(*index);
      continue;
    }
    if (item.rfind("GPU-", 0) == 0) {
      int found = -1;
      for (size_t i = 0; i < t.gpus.size(); ++i) {
        if (!t.gpus[i].uuid.empty() && t.gpus[i].uuid.rfind(item, 0) == 0) found = static_cast<int>(i);
      }
      if (found >= 0) {
        out.push_back(found);
        continue;
      }
    }
    if (why) *why = "cannot tell which PCI device " + variable + " entry '" + item + "' is";
    return std::nullopt;
  }
  return out;
}

std::optional<std::vector<int>> visible_gpus_of(
    const Topology& t, GpuMaker maker, const std::function<std::optional<std::string>(const std::string&)>& env,
    std::string* why) {
  switch (maker) {
    case GpuMaker::Nvidia: return visible_gpus(t, env("CUDA_VISIBLE_DEVICES"), why);
    case GpuMaker::Intel: return visible_gpus(t, env("ZE_AFFINITY_MASK"), why, "ZE_AFFINITY_MASK");
    case GpuMaker::Amd: break;
  }
  // ROCr narrows the devices first; HIP's list indexes what ROCr shows.
  auto shown = visible_gpus(t, env("ROCR_VISIBLE_DEVICES"), why, "ROCR_VISIBLE_DEVICES");
  if (!shown) return std::nullopt;
  std::string hip_variable = "HIP_VISIBLE_DEVICES";
  auto hip = env(hip_variable);
  if (!hip) hip = env(hip_variable = "CUDA_VISIBLE_DEVICES");
  if (!hip) return shown;
  Topology of_rocr;
  for (int g : *shown) of_rocr.gpus.push_back(t.gpus.at(static_cast<size_t>(g)));
  const auto picked = visible_gpus(of_rocr, hip, why, hip_variable);
  if (!picked) return std::nullopt;
  std::vector<int> out;
  for (int i : *picked) out.push_back(shown->at(static_cast<size_t>(i)));
  return out;
}

namespace {

using CpusByNode = std::map<int, std::vector<CpuInfo>>;

// A rank's NUMA node, and its place among the ranks (or GPUs) sharing that node.
struct NodeShare {
  int node = 0;
  int position = 0;
  int peers = 0;
};

std::vector<NodeShare> share_nodes(const Topology& t, const CpusByNode& by_node, int nproc,
                                   const std::vector<int>& gpus, bool gpu_workers) {
  std::vector<NodeShare> share(nproc);
  if (!gpu_workers) {
    // CPU workers: the NUMA nodes split evenly, in rank order.
    std::vector<int> nodes;
    for (const auto& [n, cpus] : by_node) nodes.push_back(n);
    std::map<int, int> seen;
    for (int r = 0; r < nproc; ++r) {
      share[r].node = nodes[static_cast<size_t>(r) * nodes.size() / static_cast<size_t>(nproc)];
      share[r].position = seen[share[r].node]++;
    }
    for (int r = 0; r < nproc; ++r) share[r].peers = seen[share[r].node];
    return share;
  }
  for (int r = 0; r < nproc; ++r) {
    const GpuInfo& g = t.gpus.at(gpus[r]);
    share[r].node = g.numa_node;
    if (!by_node.count(g.numa_node)) {
      std::set<int> all;
      for (const CpuInfo& c : t.cpus) all.insert(c.id);
      throw ConfigError("--numa_binding: GPU " + std::to_string(r) + " (" + g.pci_address + ") is on NUMA node " +
                        std::to_string(g.numa_node) + ", where ddprun may use no CPU (it may use " +
                        format_cpu_list(all) + ")");
    }
    // Peers: every visible GPU on the node, in CUDA order (as torchrun divides them).
    for (size_t k = 0; k < gpus.size(); ++k) {
      if (t.gpus.at(gpus[k]).numa_node != g.numa_node) continue;
      if (static_cast<int>(k) == r) share[r].position = share[r].peers;
      ++share[r].peers;
    }
  }
  return share;
}

// exclusive: the rank's even share of its node's physical cores (whole cores, with their threads).
std::set<int> exclusive_cpus(const std::vector<CpuInfo>& mine, const NodeShare& s, bool gpu_workers) {
  std::map<int, std::set<int>> cores;  // by the core's lowest CPU
  for (const CpuInfo& c : mine) cores[c.core].insert(c.id);
  const int per = static_cast<int>(cores.size()) / s.peers;
  const int extra = static_cast<int>(cores.size()) % s.peers;
  if (per < 1) {
    throw ConfigError("--numa_binding exclusive: NUMA node " + std::to_string(s.node) + " has " +
                      std::to_string(cores.size()) + " physical core(s) ddprun may use for " + std::to_string(s.peers) +
                      (gpu_workers ? " GPUs" : " ranks") +
                      ": each needs a core of its own; use --numa_binding node, or fewer workers");
  }
  const int start = s.position * per + std::min(s.position, extra);
  const int end = start + per + (s.position < extra ? 1 : 0);
  std::set<int> out;
  int k = 0;
  for (const auto& [core, cpus] : cores) {
    if (k >= start && k < end) out.insert(cpus.begin(), cpus.end());
    ++k;
  }
  return out;
}

// core-complex: one group of cores sharing the last-level cache, the largest first, round robin.
std::set<int> core_complex_cpus(const std::vector<CpuInfo>& mine, const NodeShare& s) {
  std::map<int, std::set<int>> caches;
  for (const CpuInfo& c : mine) caches[c.cache].insert(c.id);
  std::vector<std::pair<int, std::set<int>>> ordered(caches.begin(), caches.end());
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  return ordered[static_cast<size_t>(s.position) % ordered.size()].second;
}

std::set<int> cpus_for(const Topology& t, NumaBinding mode, const std::vector<CpuInfo>& mine, const NodeShare& s,
                       bool gpu_workers) {
  std::set<int> out;
  switch (mode) {
    case NumaBinding::Off: break;
    case NumaBinding::Node:
      for (const CpuInfo& c : mine) out.insert(c.id);
      break;
    case NumaBinding::Socket:
      for (const CpuInfo& c : t.cpus) {
        if (c.package == mine.front().package) out.insert(c.id);
      }
      break;
    case NumaBinding::Exclusive: return exclusive_cpus(mine, s, gpu_workers);
    case NumaBinding::CoreComplex: return core_complex_cpus(mine, s);
  }
  return out;
}

}  // namespace

std::vector<RankPlacement> place_ranks(const Topology& t, NumaBinding mode, int nproc, const std::vector<int>& gpus) {
  std::vector<RankPlacement> out;
  if (mode == NumaBinding::Off || nproc <= 0) return out;
  if (t.cpus.empty()) throw ConfigError("--numa_binding: no CPU to bind to");
  CpusByNode by_node;
  for (const CpuInfo& c : t.cpus) by_node[c.numa_node].push_back(c);
  const bool gpu_workers = !gpus.empty() && static_cast<int>(gpus.size()) >= nproc;
  const std::vector<NodeShare> share = share_nodes(t, by_node, nproc, gpus, gpu_workers);
  for (int r = 0; r < nproc; ++r) {
    RankPlacement p;
    p.numa_node = share[r].node;
    if (gpu_workers) p.near = "GPU " + std::to_string(r) + " (" + t.gpus.at(gpus[r]).pci_address + ")";
    p.cpus = cpus_for(t, mode, by_node.at(share[r].node), share[r], gpu_workers);
    out.push_back(std::move(p));
  }
  // Each rank's share of physical cores: those of its CPU set over the ranks given the same set.
  std::map<int, int> core_of;
  for (const CpuInfo& c : t.cpus) core_of[c.id] = c.core;
  for (RankPlacement& p : out) {
    std::set<int> cores;
    for (int c : p.cpus) cores.insert(core_of[c]);
    const auto sharing =
        std::count_if(out.begin(), out.end(), [&](const RankPlacement& q) { return q.cpus == p.cpus; });
    p.threads = std::max<int>(1, static_cast<int>(cores.size()) / static_cast<int>(sharing));
  }
  return out;
}

}  // namespace ddprun::launcher::workers
