#include "ddprun/worker/distributed.hpp"
#include "ddprun/worker/progress.hpp"
#include "ddprun/worker/tcp_store.hpp"

#include "gloo_device.hpp"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>
#include <torch/csrc/distributed/c10d/debug.h>
#include <torch/cuda.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <thread>

#ifdef DDPRUN_WORKER_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
// Gloo's own headers: Debian's libtorch-dev has them (libgloo-dev); PyTorch's wheels link Gloo in
// but ship none of them, and an SDK built from a wheel without -DDDPRUN_GLOO_INCLUDE_DIR offers NCCL
// only (see cmake/DdprunTorch.cmake).
#ifdef DDPRUN_WORKER_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace ddprun::worker {

#ifdef DDPRUN_WORKER_GLOO
std::shared_ptr<gloo::transport::Device> detail::make_gloo_device() {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  try {
    return c10d::ProcessGroupGloo::createDeviceForHostname(host);
  } catch (const std::exception&) {
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }
}
#endif

namespace {

// PyTorch 1.13's store-based barrier after creating the default group: every rank adds 1 to
// "store_based_barrier_key:1" and waits for world_size arrivals (Python ranks of a mixed job wait
// for it too).
void store_based_barrier(c10d::Store& store, int world_size, std::chrono::milliseconds timeout) {
  const std::string key = "store_based_barrier_key:1";
  store.add(key, 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const int64_t arrived = store.add(key, 0);
    if (arrived >= world_size) return;
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("timed out after " + std::to_string(timeout.count() / 1000) + "s waiting for all " +
                               std::to_string(world_size) + " ranks to join the process group (" +
                               std::to_string(arrived) + " arrived)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // sleep override: PyTorch's polling barrier
  }
}

#ifndef DDPRUN_WORKER_GLOO
constexpr const char* kNoGloo =
    "backend 'gloo' is not in this build of the ddprun worker SDK: it was built without Gloo's headers (PyTorch's "
    "wheels ship none); use backend 'nccl' or 'auto' on GPUs, or rebuild with -DDDPRUN_GLOO_INCLUDE_DIR=DIR naming "
    "a directory that holds gloo/algorithm.h (Debian's libgloo-dev installs it in /usr/include)";
#endif

// A Gloo or NCCL group of `size` ranks meeting through `store`.
c10::intrusive_ptr<CommGroup> make_group(const std::string& backend, const c10::intrusive_ptr<c10d::Store>& store,
                                         int rank, int size, std::chrono::milliseconds timeout) {
#ifdef DDPRUN_WORKER_NCCL
  if (backend == "nccl") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  }
#endif
#ifdef DDPRUN_WORKER_GLOO
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(detail::make_gloo_device());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
#else
  throw std::invalid_argument(kNoGloo);
#endif
}

}  // namespace

Distributed Distributed::init(const InitOptions& options) { return init(WorkerEnv::from_environment(), options); }

Distributed Distributed::init(const WorkerEnv& env, const InitOptions& options) {
  // A peer that vanishes must surface as an error from the collective that notices, not as a
  // silent death by SIGPIPE on the next socket write (Python ignores SIGPIPE for the same reason).
  // A handler the program installed itself is left alone.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  progress();                            // tells ddprun's watchdog this rank reports its progress (see progress.hpp)
  c10d::setDebugLevelFromEnvironment();  // TORCH_DISTRIBUTED_DEBUG, as importing torch.distributed does
  Distributed d;
  d.env_ = env;
  d.timeout_ = options.timeout();
  std::string backend = options.backend();
  if (backend == "auto") backend = torch::cuda::is_available() ? "nccl" : "gloo";
  if (backend != "gloo" && backend != "nccl") {
    throw std::invalid_argument("unknown backend '" + options.backend() + "': use auto, gloo or nccl");
  }
#ifndef DDPRUN_WORKER_NCCL
  if (backend == "nccl") {
    if (options.backend() == "nccl") {
      throw std::invalid_argument("backend 'nccl' needs a ddprun worker SDK built against a CUDA LibTorch with NCCL");
    }
    backend = "gloo";
  }
#endif
#ifndef DDPRUN_WORKER_GLOO
  if (backend == "gloo") throw std::invalid_argument(kNoGloo);
#endif
  d.backend_ = backend;

  c10::intrusive_ptr<c10d::Store> store;
  if (env.launched) {
    c10d::TCPStoreOptions opts = tcp_store_client_options(static_cast<uint16_t>(env.master_port), options.timeout());
    opts.numWorkers = static_cast<size_t>(env.world_size);
    try {
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot reach the store at " + env.master_addr + ":" + std::to_string(env.master_port) +
                               " (MASTER_ADDR/MASTER_PORT): " + e.what());
    }
    if (env.use_agent_store) {
      store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count), store);
    }
  } else {
    store = c10::make_intrusive<c10d::HashStore>();
  }
  d.store_ = store;
  auto pg_store =
      c10::make_intrusive<c10d::PrefixStore>("0", c10::make_intrusive<c10d::PrefixStore>("default_pg", store));
  CollectiveWait joining;  // from here on this rank waits for the others

  if (backend == "nccl") d.device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  d.pg_ = make_group(backend, pg_store, env.rank, env.world_size, options.timeout());
#ifdef DDPRUN_WORKER_NCCL
  if (auto nccl = c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupNCCL>(d.pg_)) {
    d.nccl_shutdown_ = std::shared_ptr<void>(nullptr, [nccl](void*) {
      if (nccl.use_count() != 1) return;  // a DDP or a copy still uses it
      try {
        nccl->shutdown();
      } catch (const std::exception& e) {
        std::cerr << "ddprun worker: shutting the NCCL group down: " << e.what() << "\n";
      }
    });
  }
#endif
  if (c10d::debug_level() == c10d::DebugLevel::Detail) {
#ifndef DDPRUN_WORKER_GLOO
    throw std::invalid_argument(std::string("TORCH_DISTRIBUTED_DEBUG=DETAIL checks each collective with a Gloo "
                                            "group first, as Python does: ") +
                                kNoGloo);
#else
    // As Python's _create_process_group_wrapper: a helper Gloo group checks each collective first.
    auto helper_store = c10::make_intrusive<c10d::PrefixStore>(
        "pg_wrapper:0", c10::make_intrusive<c10d::PrefixStore>("default_pg", store));
    auto helper_opts = c10d::ProcessGroupGloo::Options::create(options.timeout());
    helper_opts->devices.push_back(detail::make_gloo_device());
    auto helper = c10::make_intrusive<c10d::ProcessGroupGloo>(helper_store, env.rank, env.world_size, helper_opts);
    d.pg_ = c10::make_intrusive<c10d::ProcessGroupWrapper>(d.pg_, helper);
#endif
  }
  d.pg_->setSequenceNumberForGroup();
  d.c10d_group_ = as_c10d_group(d.pg_, pg_store, d.device_);
  if (env.launched) {
    store_based_barrier(*c10::make_intrusive<c10d::PrefixStore>("default_pg", store), env.world_size,
                        options.timeout());
  }
  progress();
  return d;
}

c10::intrusive_ptr<c10d::ProcessGroup> as_c10d_group(const c10::intrusive_ptr<CommGroup>& group,
                                                     const c10::intrusive_ptr<c10d::Store>& store,
                                                     torch::Device device) {
#if TORCH_VERSION_MAJOR >= 2
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, group->getRank(), group->getSize());
  const auto type =
      group->getBackendName() == "nccl" ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
  pg->setBackend(c10::DeviceType::CPU, type, group);
  // As init_process_group's backend map: "gloo" serves CPU and CUDA tensors (Gloo copies CUDA
  // tensors through the host), "nccl" CUDA tensors.
  if (device.is_cuda() || type == c10d::ProcessGroup::BackendType::GLOO) {
    pg->setBackend(c10::DeviceType::CUDA, type, group);
  }
  pg->setDefaultBackend(type);
  return pg;
#else
  (void)store;
  (void)device;
  return group;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> Distributed::new_subgroups(int group_size) {
  if (group_size <= 0) group_size = env_.local_world_size;
  if (group_size > world_size() || world_size() % group_size != 0) {
    throw std::invalid_argument("new_subgroups: the world size (" + std::to_string(world_size()) +
                                ") must be a multiple of group_size (" + std::to_string(group_size) + ")");
  }
  // Every rank calls this the same number of times, as Python's new_group: the call's number keeps
  // the groups of different calls apart in the store.
  const int call = ++subgroup_calls_;
  const int index = rank() / group_size;
  auto store =
      c10::make_intrusive<c10d::PrefixStore>("subgroups_" + std::to_string(call) + "/" + std::to_string(index), store_);
  CollectiveWait joining;
  auto group = make_group(backend_, store, rank() % group_size, group_size, timeout_);
  group->setSequenceNumberForGroup();
  return as_c10d_group(group, store, device_);
}

namespace {

// Runs a collective and waits for it; LibTorch's errors (c10::Error, whose what() carries a C++
// backtrace) become std::runtime_error with the sentence alone, as Python shows them.
template <typename Start>
void run_collective(const char* what, Start start) {
  CollectiveWait waiting;
  try {
    start()->wait();
  } catch (const c10::Error& e) {
    throw std::runtime_error(std::string(what) + ": " + e.what_without_backtrace());
  }
}

}  // namespace

void Distributed::barrier() {
  run_collective("barrier", [&] { return pg_->barrier(); });
}

void Distributed::all_reduce_sum(torch::Tensor& t) {
  std::vector<torch::Tensor> ts{t};
  run_collective("all_reduce", [&] { return pg_->allreduce(ts); });
}

double Distributed::sum(double value) {
  auto t = torch::tensor({value}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  all_reduce_sum(t);
  return t.cpu().item<double>();
}

double Distributed::mean(double value) { return sum(value) / world_size(); }

double Distributed::max(double value) {
  auto t = torch::tensor({value}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  std::vector<torch::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  run_collective("all_reduce", [&] { return pg_->allreduce(ts, opts); });
  return t.cpu().item<double>();
}

}  // namespace ddprun::worker
