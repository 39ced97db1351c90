#pragma once
// --numa_binding: which CPUs each local rank runs on, and which NUMA node its memory comes from,
// with the modes of torchrun 2.x's --numa-binding:
//   node          every CPU of the rank's NUMA node
//   socket        every CPU of the socket (package) holding that NUMA node
//   exclusive     an even share of the NUMA node's physical cores (hyperthreads stay together),
//                 no two ranks sharing a core; the lowest ranks get one more when it does not divide
//   core-complex  one group of cores sharing the last-level cache (an L3 "CCX") of that node, a
//                 different one for each rank while there are enough
// The rank's NUMA node: for GPU workers (one visible GPU per local rank) the GPU's own, from its
// PCI device in sysfs; for CPU workers the NUMA nodes are shared out evenly in rank order.
// Everything is read from sysfs (a root the tests point elsewhere) and limited to the CPUs ddprun
// itself may use (its affinity: a Slurm or cgroup allocation is kept). Pure apart from reading.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher::workers {

enum class NumaBinding { Off, Node, Socket, Exclusive, CoreComplex };

// "node", "socket", "exclusive", "core-complex" (or core_complex); nullopt for anything else.
std::optional<NumaBinding> parse_numa_binding(std::string_view text);
std::string numa_binding_name(NumaBinding mode);

// The kernel's CPU list format: "0-3,8,10-11" <-> {0,1,2,3,8,10,11}. parse: nullopt if malformed.
std::optional<std::set<int>> parse_cpu_list(std::string_view text);
std::string format_cpu_list(const std::set<int>& cpus);

struct CpuInfo {
  int id = 0;
  int numa_node = 0;
  int package = 0;  // socket
  int core = 0;     // the lowest CPU id of its physical core (hyperthread siblings share it)
  int cache = 0;    // the lowest CPU id sharing its last-level cache
};

struct GpuInfo {
  std::string pci_address;  // "0000:3b:00.0"
  int numa_node = 0;        // 0 when the firmware says -1 (one node)
  std::string uuid;         // "GPU-..." from the NVIDIA driver, "" if unknown
};

struct Topology {
  std::vector<CpuInfo> cpus;  // the CPUs ddprun may use, by id
  std::vector<GpuInfo> gpus;  // NVIDIA GPUs in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi's)
};

// Reads ROOT/sys/devices/system/{node,cpu} and ROOT/sys/bus/pci/devices (and the NVIDIA driver's
// ROOT/proc/driver/nvidia/gpus/*/information for UUIDs). `allowed`: the CPUs this process may use.
// Throws ConfigError naming the file it could not make sense of.
Topology read_topology(const std::string& root, const std::set<int>& allowed);

// The CPUs this process may run on (sched_getaffinity).
std::set<int> allowed_cpus();

// The GPUs the workers see, as indices into Topology::gpus in CUDA's order: CUDA_VISIBLE_DEVICES
// (indices or GPU-UUIDs), or all of them. nullopt, with `why` set, when that cannot be told (a
// MIG instance, an unknown UUID).
std::optional<std::vector<int>> visible_gpus(const Topology& t, const std::optional<std::string>& cuda_visible_devices,
                                             std::string* why);

struct RankPlacement {
  std::set<int> cpus;
  int numa_node = 0;  // where its memory is preferred
  int threads = 1;    // its share of physical cores (OMP_NUM_THREADS unless the user set it)
  std::string near;   // what placed it: "GPU 3 (0000:3b:00.0)" or "" for a CPU worker
};

// Each local rank's placement. `gpus`: the visible GPUs (local rank r uses gpus[r]); when there
// are fewer than `nproc`, the ranks are CPU workers. Throws ConfigError when the mode cannot be
// met (fewer physical cores on a node than ranks for exclusive).
std::vector<RankPlacement> place_ranks(const Topology& t, NumaBinding mode, int nproc, const std::vector<int>& gpus);

}  // namespace ddprun::launcher::workers
