#pragma once
// DistributedDataParallel for LibTorch modules: PyTorch's torch.nn.parallel.DistributedDataParallel,
// option for option, with the same results.
//
// Underneath is LibTorch's own c10d::Reducer, the engine Python DDP runs on (bucketing, the
// autograd hooks that launch each bucket's all-reduce while backward still runs, unused-parameter
// detection, the bucket rebuild after the first iteration, static graphs, gradients as bucket
// views, DDP's logging data), driven as torch/nn/parallel/distributed.py of the LibTorch release
// it is built against drives it (1.13 or 2.x; where the two releases differ, so does this). What
// Python does in Python is done here in C++: the construction-time check of every rank's parameter
// shapes, the broadcast of rank 0's parameters and buffers, the forward-time decisions (whether
// this forward's backward reduces, whether buffers are broadcast first), the output sink of
// find_unused_parameters and static_graph.
//
// On CPU with Gloo the buckets are summed by the SDK's direct Gloo ring (DdpOptions::direct_gloo):
// several times lower latency than ProcessGroupGloo's queue, and the same summation order, so the
// same bits.
//
// Thread-safety: one training thread drives forward/backward; the hooks run on LibTorch's autograd
// threads.

#include <c10/util/Logging.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ddprun/worker/comm_hooks.hpp"
#include "ddprun/worker/distributed.hpp"
#include "ddprun/worker/join.hpp"

namespace ddprun::worker {

// How the training thread waits for the gradient all-reduces left at the end of backward (direct
// Gloo path only; the background thread always sleeps in recv).
enum class BusyPoll {
  Auto,  // spin when LOCAL_WORLD_SIZE x intra-op threads fit the CPUs this process may run on
  On,    // spin on the sockets, as NCCL and MPI wait: saves a wake-up per message
  Off,   // sleep in recv
};

// Python DDP's constructor arguments, with its defaults, set as LibTorch's options are:
// DdpOptions().find_unused_parameters(true).bucket_cap_bytes(50 << 20).
struct DdpOptions {
  // bucket_cap_mb, in bytes.
  TORCH_ARG(size_t, bucket_cap_bytes) = 25u << 20;
  // The first bucket's cap after the rebuild (Python: torch.distributed._DEFAULT_FIRST_BUCKET_BYTES,
  // 1 MiB). Unset: as the release's Python DDP does: 1 MiB on 1.x; on 2.x 1 MiB with the default
  // bucket_cap_bytes and bucket_cap_bytes otherwise (what Python 2.x does when bucket_cap_mb is given).
  TORCH_ARG(std::optional<size_t>, first_bucket_cap_bytes);
  // Walk the autograd graph from the forward's outputs after each forward and mark the parameters
  // it does not reach as ready. A parameter unused on every rank keeps its gradient as it was
  // (undefined stays undefined, so optimizers skip it); one unused on some ranks gets the average.
  // Without it, a parameter that gets no gradient is an error at the next forward, naming it.
  TORCH_ARG(bool, find_unused_parameters) = false;
  // Broadcast rank 0's buffers (e.g. BatchNorm statistics) before each forward whose backward
  // reduces gradients (and, on 2.x, at construction only when true).
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Gradients are views into the buckets from the second iteration on: no copy, and the
  // gradients' memory once rather than twice. Zero them in place (set_to_none false) to keep it.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  // The set of used parameters and the order of their gradients never changes: the first
  // iteration records it, later ones rely on it. Makes a module run twice per forward (or
  // reentrant backward) work, and finds unused parameters without walking the graph.
  TORCH_ARG(bool, static_graph) = false;
  // Check every rank's parameter shapes and broadcast rank 0's parameters and buffers at
  // construction (PyTorch 2.7's init_sync).
  TORCH_ARG(bool, init_sync) = true;
  // Fully qualified names ("fc1.weight", "bn.running_mean") of parameters and buffers DDP neither
  // synchronises nor reduces (Python's _set_params_and_buffers_to_ignore_for_model).
  TORCH_ARG(std::vector<std::string>, params_and_buffers_to_ignore);
  // With the Gloo backend, sum CPU float/double buckets over the SDK's direct Gloo ring instead of
  // the process group's queue (see the file comment). Costs one extra set of connections per DDP
  // object. Off for TORCH_DISTRIBUTED_DEBUG=DETAIL, whose checked process group then does them.
  TORCH_ARG(bool, direct_gloo) = true;
  // With direct_gloo: whether the waiting training thread spins (see BusyPoll).
  TORCH_ARG(BusyPoll, busy_poll) = BusyPoll::Auto;
};

namespace detail {

// The non-template engine behind DistributedDataParallel: the reducer and Python DDP's forward
// logic. Collective at construction.
class DdpCore {
 public:
  DdpCore(torch::nn::Module& module, Distributed& dist, const DdpOptions& options);
  ~DdpCore();
  DdpCore(const DdpCore&) = delete;
  DdpCore& operator=(const DdpCore&) = delete;

  // Before the module's forward: prepares the reducer, notifies a Join `self` is in, rebuilds
  // buckets after the first iteration, broadcasts buffers when Python would.
  void pre_forward(Joinable& self);
  // After it: prepares for backward (finding unused parameters from `outputs`) and, where Python
  // passes the outputs through its sink, replaces them in place. True when they were replaced.
  bool post_forward(std::vector<at::Tensor>& outputs);

  bool require_backward_grad_sync() const;
  void set_require_backward_grad_sync(bool on);
  void set_static_graph();
  c10::DDPLoggingData logging_data() const;
  std::vector<std::vector<size_t>> bucket_layout() const;
  bool direct_gloo() const;
  // What the reducer and DDP's broadcasts run on (the direct Gloo path when it is on).
  c10::intrusive_ptr<c10d::ProcessGroup> process_group() const;
  // Python's register_comm_hook: `name` is what DDP's logging data reports as comm_hook.
  void register_comm_hook(std::function<comm_hooks::TensorFuture(c10d::GradBucket&)> hook, const std::string& name);
  // Python's join_hook(divide_by_initial_world_size=...), join_device.
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options);
  torch::Device device() const;

  struct Impl;  // defined in ddp.cpp

 private:
  std::shared_ptr<Impl> impl_;
};

// The tensors of a forward's output, found as Python's _find_tensors finds them: a tensor, and the
// tensors inside vectors, tuples and pairs of them. Other types hold none.
template <typename T>
struct OutputTensors {
  static void collect(const T&, std::vector<at::Tensor>&) {}
  static void replace(T&, const std::vector<at::Tensor>&, size_t&) {}
};
template <>
struct OutputTensors<at::Tensor> {
  static void collect(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
  static void replace(at::Tensor& t, const std::vector<at::Tensor>& in, size_t& i) { t = in[i++]; }
};
template <typename E>
struct OutputTensors<std::vector<E>> {
  static void collect(const std::vector<E>& v, std::vector<at::Tensor>& out) {
    for (const auto& e : v) OutputTensors<E>::collect(e, out);
  }
  static void replace(std::vector<E>& v, const std::vector<at::Tensor>& in, size_t& i) {
    for (auto& e : v) OutputTensors<E>::replace(e, in, i);
  }
};
template <typename... Ts>
struct OutputTensors<std::tuple<Ts...>> {
  static void collect(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out) {
    std::apply([&](const auto&... e) { (OutputTensors<std::decay_t<decltype(e)>>::collect(e, out), ...); }, t);
  }
  static void replace(std::tuple<Ts...>& t, const std::vector<at::Tensor>& in, size_t& i) {
    std::apply([&](auto&... e) { (OutputTensors<std::decay_t<decltype(e)>>::replace(e, in, i), ...); }, t);
  }
};
template <typename A, typename B>
struct OutputTensors<std::pair<A, B>> {
  static void collect(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
    OutputTensors<A>::collect(p.first, out);
    OutputTensors<B>::collect(p.second, out);
  }
  static void replace(std::pair<A, B>& p, const std::vector<at::Tensor>& in, size_t& i) {
    OutputTensors<A>::replace(p.first, in, i);
    OutputTensors<B>::replace(p.second, in, i);
  }
};

}  // namespace detail

// A module, as Python's DDP is: the wrapped module is its child "module", so its parameters,
// buffers, train()/eval(), state_dict (names "module.fc1.weight", as Python's DDP writes them),
// torch::save/torch::load and pretty printing go through it; made with std::make_shared it can
// be another module's child (register_module) and used with `->`. Not a clone()able module (a
// DDP object is collective state: clone the wrapped module and wrap the copy), nor one to move
// to another device after construction (move the module first), as in Python.
template <typename ModuleType>
class DistributedDataParallel : public torch::nn::Module, public Joinable {
 public:
  // Collective: every rank constructs its DDP objects in the same order. Throws, on every rank,
  // when the ranks' parameters differ in number, shape or stride.
  DistributedDataParallel(std::shared_ptr<ModuleType> module, Distributed& dist, DdpOptions options = {})
      : torch::nn::Module("DistributedDataParallel"),
        module_(register_module("module", std::move(module))),
        core_(std::make_unique<detail::DdpCore>(*module_, dist, options)) {}
  DistributedDataParallel(torch::nn::ModuleHolder<ModuleType> module, Distributed& dist, DdpOptions options = {})
      : DistributedDataParallel(module.ptr(), dist, std::move(options)) {}

  // The module's forward, with Python DDP's work before and after it.
  template <typename... Args>
  auto forward(Args&&... args) {
    core_->pre_forward(*this);
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::OutputTensors<decltype(output)>::collect(output, tensors);
    if (core_->post_forward(tensors)) {
      size_t i = 0;
      detail::OutputTensors<decltype(output)>::replace(output, tensors, i);
    }
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // While the guard lives, forwards prepare no gradient reduction: their backwards only
  // accumulate local gradients, and the first backward of a forward run outside reduces the sum.
  // As in Python, it is the forward that decides: a forward outside the guard whose backward runs
  // inside it still reduces.
  class NoSync {
   public:
    explicit NoSync(detail::DdpCore& core) : core_(&core), previous_(core.require_backward_grad_sync()) {
      core.set_require_backward_grad_sync(false);
    }
    ~NoSync() {
      if (core_) core_->set_require_backward_grad_sync(previous_);
    }
    NoSync(NoSync&& o) noexcept : core_(std::exchange(o.core_, nullptr)), previous_(o.previous_) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    detail::DdpCore* core_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*core_); }

  ModuleType& module() { return *module_; }
  const std::shared_ptr<ModuleType>& module_ptr() const { return module_; }

  // Python's register_comm_hook(state, hook): from the next backward on, each bucket's gradients,
  // summed over nothing yet and not divided by the world size, go to hook(state, bucket), whose
  // future's tensor (Tensor or [Tensor]) becomes the bucket's gradients once complete. The hook
  // runs on an autograd thread while backward still runs, and must launch the same collectives
  // in the same order on every rank. `state` is kept (by value: share it with a shared_ptr) for
  // as long as this object; `name` is DDP's logging data's comm_hook. Once per object (a second
  // hook is an error, as in Python). See comm_hooks.hpp for the built-in hooks.
  template <typename State, typename Hook>
  void register_comm_hook(State state, Hook hook, const std::string& name = "comm_hook") {
    core_->register_comm_hook([state = std::move(state), hook = std::move(hook)](
                                  c10d::GradBucket& bucket) mutable { return hook(state, bucket); },
                              name);
  }
  // One of the built-in hooks of default_hooks.py, on this DDP's process group (for allreduce,
  // fp16 and bf16: on CPU with Gloo, the direct ring), named as Python names them.
  void register_comm_hook(comm_hooks::Builtin hook) {
    register_comm_hook(process_group(), comm_hooks::function_of(hook), comm_hooks::name_of(hook));
  }
  // The process group DDP's gradients are reduced on: the state to give the built-in hooks.
  c10::intrusive_ptr<c10d::ProcessGroup> process_group() const { return core_->process_group(); }

  // Python's `with ddp.join(divide_by_initial_world_size, enable, throw_on_early_termination):
  // body`: runs body (the training loop over this rank's batches), then shadows the other ranks'
  // iterations until every rank has run out of batches, then takes the model of the last rank to
  // finish (see join.hpp). Collective.
  template <typename Body>
  void join(Body&& body, JoinOptions options = {}) {
    Join(std::vector<std::reference_wrapper<Joinable>>{*this}, options).run(std::forward<Body>(body));
  }
  // Joinable: the hook a Join runs once this rank has joined (Python's join_hook(**kwargs)).
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override { return core_->join_hook(options); }
  torch::Device join_device() const override { return core_->device(); }
  c10::intrusive_ptr<c10d::ProcessGroup> join_process_group() const override { return core_->process_group(); }

  // Python's _set_static_graph(): before the first iteration (DdpOptions::static_graph does it).
  void set_static_graph() { core_->set_static_graph(); }
  // Python's _get_ddp_logging_data(): strs_map and ints_map with the same keys.
  c10::DDPLoggingData logging_data() const { return core_->logging_data(); }
  // The reducer's buckets, as parameter indices (DDP's parameter order), in reduction order.
  std::vector<std::vector<size_t>> bucket_layout() const { return core_->bucket_layout(); }
  // True when gradients are summed on the direct Gloo ring rather than the process group.
  bool uses_direct_gloo() const { return core_->direct_gloo(); }

 private:
  std::shared_ptr<ModuleType> module_;
  std::unique_ptr<detail::DdpCore> core_;
};

}  // namespace ddprun::worker
