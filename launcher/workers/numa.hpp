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

#include <functional>
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

// Whose GPUs a job's ranks use: NVIDIA's (CUDA), AMD's (ROCm/HIP) or Intel's (Level Zero).
enum class GpuMaker { Nvidia, Amd, Intel };

struct GpuInfo {
  std::string pci_address;  // "0000:3b:00.0"
  int numa_node = 0;        // 0 when the firmware says -1 (one node)
  std::string uuid;         // "GPU-..." from the NVIDIA driver, "" if unknown
};

struct Topology {
  std::vector<CpuInfo> cpus;  // the CPUs ddprun may use, by id
  // The maker's GPUs in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID and nvidia-smi's for NVIDIA; the
  // order ROCm and Level Zero enumerate them in on one machine's bus).
  std::vector<GpuInfo> gpus;
};

// Reads ROOT/sys/devices/system/{node,cpu} and ROOT/sys/bus/pci/devices: the display controllers
// (VGA, 3D, and "display" as AMD's Instinct and Intel's data-center GPUs are classed) of `maker`'s
// PCI vendor id, with the NVIDIA driver's ROOT/proc/driver/nvidia/gpus/*/information for UUIDs.
// `allowed`: the CPUs this process may use. Throws ConfigError naming the file it could not make
// sense of.
Topology read_topology(const std::string& root, const std::set<int>& allowed, GpuMaker maker = GpuMaker::Nvidia);

// The CPUs this process may run on (sched_getaffinity).
std::set<int> allowed_cpus();

// The GPUs the workers see, as indices into Topology::gpus in CUDA's order: CUDA_VISIBLE_DEVICES
// (indices or GPU-UUIDs), or all of them. nullopt, with `why` set, when that cannot be told (a
// MIG instance, an unknown UUID).
// `variable` names the list in messages. An entry "N.M" (Level Zero's tile M of device N) is device N
// (each tile listed is a device of its own to the ranks, on N's NUMA node).
std::optional<std::vector<int>> visible_gpus(const Topology& t, const std::optional<std::string>& cuda_visible_devices,
                                             std::string* why, const std::string& variable = "CUDA_VISIBLE_DEVICES");

// The GPUs `maker`'s runtime shows the workers, read from their environment through `env`: NVIDIA's
// CUDA_VISIBLE_DEVICES; AMD's ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES (or
// CUDA_VISIBLE_DEVICES, which HIP also reads) as indices into what ROCr shows; Intel's
// ZE_AFFINITY_MASK.
std::optional<std::vector<int>> visible_gpus_of(
    const Topology& t, GpuMaker maker, const std::function<std::optional<std::string>(const std::string&)>& env,
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
