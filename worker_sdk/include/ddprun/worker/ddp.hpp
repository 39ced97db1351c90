#pragma once
// DistributedDataParallel for LibTorch modules.
//
// At wrap time the parameters and buffers of rank 0 are broadcast to every rank. During backward,
// gradients are gathered into buckets (default 25 MiB, the first 1 MiB, filled in reverse
// registration order, so the last layers' gradients, which are ready first, go first); each
// bucket's all-reduce starts as soon as its last gradient is accumulated, while backward keeps
// running, and is averaged over the ranks. When backward ends the averaged gradients are in
// param.grad(), ready for any optimizer.
//
// Thread-safety: one training thread drives forward/backward; the autograd hooks and the end-of-
// backward callback run on LibTorch's autograd threads and synchronise on an internal mutex.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/worker/distributed.hpp"
#include "ddprun/worker/progress.hpp"

namespace ddprun::worker {

// How the training thread waits for the gradient all-reduces left at the end of backward (direct
// Gloo reducer only; the background thread always sleeps in recv).
enum class BusyPoll {
  Auto,  // spin when LOCAL_WORLD_SIZE x intra-op threads fit the CPUs this process may run on
  On,    // spin on the sockets, as NCCL and MPI wait: saves a wake-up per message
  Off,   // sleep in recv
};

struct DdpOptions {
  size_t bucket_cap_bytes = 25u << 20;
  size_t first_bucket_cap_bytes = 1u << 20;
  // Parameters that get no gradient in a step are reduced as zeros. When false, such a step throws
  // an error naming them (the ranks would otherwise wait for each other forever).
  bool find_unused_parameters = false;
  // Broadcast rank 0's buffers (e.g. BatchNorm running statistics) before every forward.
  bool broadcast_buffers = true;
  // With the Gloo backend, all-reduce CPU float/double buckets over a dedicated Gloo context in
  // synchronous mode instead of the process group's asynchronous work queue: about 10x lower
  // latency per bucket on a loaded host. Buckets launched during backward run on one background
  // thread; those left at the end of backward run on the training thread. Costs one extra set of
  // connections and twice the bucket memory in Gloo's scratch buffers. Needs a LibTorch that links
  // the system libgloo (Debian's does); otherwise the process group is used.
  bool direct_gloo = true;
  // With direct_gloo: whether the waiting training thread spins (see BusyPoll). Spinning ranks that
  // outnumber the cores starve each other, hence Auto.
  BusyPoll busy_poll = BusyPoll::Auto;
};

namespace detail {

// The non-template engine behind DistributedDataParallel: buckets, hooks, launches, finalize.
class GradientReducer {
 public:
  // Collective when world size > 1 and the direct Gloo reducer is used: every rank constructs
  // its reducers in the same order.
  GradientReducer(std::vector<std::pair<std::string, torch::Tensor>> named_params, const Distributed& dist,
                  const DdpOptions& options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  void set_sync(bool enabled);
  bool sync_enabled() const;
  // Bucket layout, for tests and diagnostics: parameter indices per bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_layout() const;
  // Whether CPU buckets go through the direct Gloo reducer (DdpOptions::direct_gloo took effect).
  bool direct_gloo() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Broadcasts tensors from rank 0, coalesced into one flat tensor per dtype.
void broadcast_coalesced(CommGroup& pg, const std::vector<torch::Tensor>& tensors);

}  // namespace detail

template <typename ModuleType>
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<ModuleType> module, Distributed& dist, DdpOptions options = {})
      : module_(std::move(module)), pg_(dist.process_group()), options_(options) {
    std::vector<torch::Tensor> state;
    for (auto& p : module_->parameters()) state.push_back(p);
    for (auto& b : module_->buffers()) state.push_back(b);
    {
      torch::NoGradGuard no_grad;
      detail::broadcast_coalesced(*pg_, state);
    }
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (auto& item : module_->named_parameters()) {
      if (item.value().requires_grad()) named.emplace_back(item.key(), item.value());
    }
    reducer_ = std::make_unique<detail::GradientReducer>(std::move(named), dist, options_);
  }

  // Calls the module's forward, broadcasting buffers first when configured.
  template <typename... Args>
  auto forward(Args&&... args) {
    progress();
    if (options_.broadcast_buffers && pg_->getSize() > 1) sync_buffers();
    return module_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  void sync_buffers() {
    auto buffers = module_->buffers();
    if (buffers.empty()) return;
    torch::NoGradGuard no_grad;
    detail::broadcast_coalesced(*pg_, buffers);
  }

  // While the guard lives, backward only accumulates local gradients (gradient accumulation);
  // the first backward after it reduces everything accumulated.
  class NoSync {
   public:
    explicit NoSync(detail::GradientReducer& r) : r_(&r), previous_(r.sync_enabled()) { r.set_sync(false); }
    ~NoSync() {
      if (r_) r_->set_sync(previous_);
    }
    NoSync(NoSync&& o) noexcept : r_(std::exchange(o.r_, nullptr)), previous_(o.previous_) {}
    NoSync(const NoSync&) = delete;

   private:
    detail::GradientReducer* r_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*reducer_); }

  ModuleType& module() { return *module_; }
  const std::shared_ptr<ModuleType>& module_ptr() const { return module_; }
  std::vector<torch::Tensor> parameters() const { return module_->parameters(); }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  std::vector<std::vector<size_t>> bucket_layout() const { return reducer_->bucket_layout(); }
  // True when gradients are reduced over the direct Gloo context rather than the process group.
  bool uses_direct_gloo() const { return reducer_->direct_gloo(); }

 private:
  std::shared_ptr<ModuleType> module_;
  c10::intrusive_ptr<CommGroup> pg_;
  DdpOptions options_;
  std::unique_ptr<detail::GradientReducer> reducer_;
};

}  // namespace ddprun::worker
