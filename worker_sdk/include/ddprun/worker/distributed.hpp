#pragma once
// Joining the job: the store client and the process group, built from the launcher's environment
// as PyTorch's init_process_group(init_method="env://") does, plus rank-aware helpers.
//
// Store: LibTorch's c10d::TCPStore client at MASTER_ADDR:MASTER_PORT; under an agent store
// (TORCHELASTIC_USE_AGENT_STORE=True) wrapped in PrefixStore("/worker/attempt_<k>"), then
// "default_pg", then the group name "0", exactly as PyTorch 1.13 lays out its keys, so C++ and
// Python workers can share one job. Process group: Gloo for CPU tensors; NCCL when this SDK was
// built against a CUDA LibTorch (DDPRUN_WORKER_NCCL) and a GPU is present.
//
// Without any launcher variables it runs as a single process (world size 1) with no code change.
//
// TORCH_DISTRIBUTED_DEBUG is read as PyTorch reads it: INFO or DETAIL name parameters in DDP's
// errors; DETAIL also wraps the process group in c10d::ProcessGroupWrapper, which checks every
// collective against the other ranks' (operation, shapes, dtypes) first, so a mismatch is an error
// naming both sides rather than a hang (its helper group's keys: "pg_wrapper:0", as Python's).
//
// init() sets SIGPIPE to ignored when it is at its default, as the Python interpreter does, so a
// rank whose peer has gone gets an error from the collective instead of being killed by the signal.

#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <chrono>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "ddprun/worker/env.hpp"

namespace ddprun::worker {

// The object collectives are issued on. PyTorch 1.x: ProcessGroupGloo/NCCL derive from
// c10d::ProcessGroup. PyTorch 2.x: they are c10d::Backend objects (a ProcessGroup only dispatches
// to them), with the same allreduce/broadcast/barrier calls, so the SDK holds the backend itself.
#if TORCH_VERSION_MAJOR >= 2
using CommGroup = c10d::Backend;
#else
using CommGroup = c10d::ProcessGroup;
#endif

// Set as LibTorch's options are: Distributed::init(InitOptions().backend("gloo").timeout(std::chrono::minutes(5))).
struct InitOptions {
  // "auto" (NCCL on GPU when available, else Gloo), "gloo" or "nccl".
  TORCH_ARG(std::string, backend) = "auto";
  // Store and collective timeout.
  TORCH_ARG(std::chrono::milliseconds, timeout){std::chrono::minutes(30)};
};

class Distributed {
 public:
  // Reads the environment, connects to the store and creates the process group. Throws
  // std::invalid_argument for a bad environment, std::runtime_error for an unreachable store.
  static Distributed init(const InitOptions& options = {});
  static Distributed init(const WorkerEnv& env, const InitOptions& options = {});

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  bool is_main() const { return env_.rank == 0; }
  const WorkerEnv& env() const { return env_; }
  // cuda:LOCAL_RANK with NCCL, else CPU.
  torch::Device device() const { return device_; }
  const std::string& backend() const { return backend_; }
  const c10::intrusive_ptr<CommGroup>& process_group() const { return pg_; }
  // The same group as a c10d::ProcessGroup, as c10d::Reducer and the c10d helpers take it (on 2.x
  // the ProcessGroup that dispatches to process_group(); on 1.x the same object).
  const c10::intrusive_ptr<c10d::ProcessGroup>& c10d_group() const { return c10d_group_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // Store and collective timeout (InitOptions::timeout).
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Python's new_subgroups(group_size): the world cut into groups of group_size consecutive ranks
  // (default: LOCAL_WORLD_SIZE, one group per node); returns this rank's group. Every rank must
  // call it, the same number of times. Throws std::invalid_argument if the world size is not a
  // multiple of group_size.
  c10::intrusive_ptr<c10d::ProcessGroup> new_subgroups(int group_size = 0);

  void barrier();
  // In-place sum / average over all ranks.
  void all_reduce_sum(torch::Tensor& t);
  // Mean of one number per rank, weighted equally.
  double mean(double value);
  // Sum of one number per rank.
  double sum(double value);
  // Largest of one number per rank (e.g. the slowest rank's epoch time).
  double max(double value);

  // Writes the arguments as one line on stdout, on rank 0 only.
  template <typename... Args>
  void print(const Args&... args) const {
    if (!is_main()) return;
    std::ostringstream line;
    (line << ... << args);
    line << '\n';
    std::cout << line.str() << std::flush;
  }

 private:
  // Declared first, so destroyed last: shuts an NCCL group down once the last copy of this object
  // goes and nothing else (a DDP still alive) holds the group, as destroy_process_group() does in
  // Python (PyTorch >= 2.4 warns at exit about a group left running).
  std::shared_ptr<void> nccl_shutdown_;
  WorkerEnv env_;
  torch::Device device_{torch::kCPU};
  std::string backend_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(30)};
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<CommGroup> pg_;
  c10::intrusive_ptr<c10d::ProcessGroup> c10d_group_;
  int subgroup_calls_ = 0;
};

// `group` as a c10d::ProcessGroup: the object itself on 1.x; on 2.x a ProcessGroup that dispatches
// its collectives to `group` for CPU tensors (and CUDA ones when `device` is CUDA).
c10::intrusive_ptr<c10d::ProcessGroup> as_c10d_group(const c10::intrusive_ptr<CommGroup>& group,
                                                     const c10::intrusive_ptr<c10d::Store>& store,
                                                     torch::Device device);

}  // namespace ddprun::worker
