#pragma once
// DdpCore's state (ddp.hpp): Python DDP's attributes and its helpers over c10d::Reducer, shared by
// ddp.cpp (construction, forward, hooks) and ddp_join.cpp (the join hook). Private to the SDK.

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/version.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ddprun/worker/ddp.hpp"
#include "ddprun/worker/progress.hpp"
#include "ddp_model.hpp"
#ifdef DDPRUN_WORKER_DIRECT_GLOO
#include "ddp_comm_group.hpp"
#endif

namespace ddprun::worker::detail {

// c10::Error's what() carries a C++ backtrace; users get the sentence, as Python shows it.
[[noreturn]] void rethrow_clean(const c10::Error& e);

inline constexpr size_t kBroadcastBucketBytes = 250u << 20;  // Python DDP's broadcast_bucket_size

// What the output sink's backward needs of its DDP (Python's weakref to the module).
struct SinkTarget {
  std::weak_ptr<c10d::Reducer> reducer;
  std::atomic<bool> static_graph{false};
  std::atomic<bool> delay_all_reduce_enqueued{false};
};

struct DdpCore::Impl : std::enable_shared_from_this<Impl> {
  torch::nn::Module* module = nullptr;
  DdpOptions options;
  std::set<std::string> ignored;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // what the reducer and the broadcasts run on
#ifdef DDPRUN_WORKER_DIRECT_GLOO
  c10::intrusive_ptr<DdpCommGroup> comm;  // the direct path, when on
#endif
  std::shared_ptr<c10d::Reducer> reducer;
  std::shared_ptr<c10d::Logger> logger;
  std::shared_ptr<SinkTarget> sink = std::make_shared<SinkTarget>();
  int64_t sink_id = 0;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;
  std::vector<std::string> parameter_names;  // the reducer's parameters, in its order
  torch::Device param_device{torch::kCPU};

  // Python DDP's state.
  bool require_backward_grad_sync = true;
  bool require_forward_param_sync = true;
  bool static_graph = false;
  int64_t num_iterations = 0;                // 1.13's count, read by the sink
  bool divide_by_initial_world_size = true;  // set by a join hook

  // End of backward, for ddprun's progress signals and the direct path's drain.
  std::mutex mutex;
  bool expect_backward = false;
  bool end_queued = false;

  ~Impl();

  std::vector<NamedTensor> buffers() const {
    std::vector<NamedTensor> out;
    for (auto& b : unique_tensors(*module, true)) {
      if (!ignored.count(b.name)) out.push_back(std::move(b));
    }
    return out;
  }

  // _sync_params_and_buffers / _sync_module_buffers: rank src's values, one coalesced broadcast per
  // bucket.
  void broadcast_from(const std::vector<at::Tensor>& tensors, int src) {
    if (tensors.empty()) return;
    torch::NoGradGuard no_grad;
    CollectiveWait waiting;
    c10d::broadcast_coalesced(pg, tensors, kBroadcastBucketBytes, src);
  }

  // _sync_module_states' tensors: every parameter (requiring a gradient or not), then, with
  // `with_buffers`, every buffer; DDP's ignored names left out.
  std::vector<at::Tensor> module_states(bool with_buffers) const {
    std::vector<at::Tensor> states;
    for (auto& p : unique_tensors(*module, false)) {
      if (!ignored.count(p.name)) states.push_back(p.tensor.detach());
    }
    if (with_buffers) {
      for (auto& b : buffers()) states.push_back(b.tensor.detach());
    }
    return states;
  }

  bool will_sync_module_buffers() const {
    return require_forward_param_sync && options.broadcast_buffers() && !buffers().empty();
  }

  void sync_module_buffers(int src) {
    std::vector<at::Tensor> tensors;
    for (auto& b : buffers()) tensors.push_back(b.tensor.detach());
    broadcast_from(tensors, src);
  }

  // The parameters' device (Python DDP's self.device), found at construction.
  torch::Device device() const { return param_device; }

  // _find_common_rank: the largest rank among those whose `candidate` is true.
  int find_common_rank(bool candidate) {
    auto t = torch::full({1}, candidate ? int64_t{pg->getRank()} : int64_t{-1},
                         torch::TensorOptions().dtype(torch::kLong).device(device()));
    std::vector<at::Tensor> tensors{t};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    {
      CollectiveWait waiting;
      pg->allreduce(tensors, max)->wait();
    }
    const auto rank = t.item<int64_t>();
    if (rank < 0) {
      throw std::logic_error("DistributedDataParallel: no rank is a candidate for the authoritative copy (a bug)");
    }
    return static_cast<int>(rank);
  }

  // _check_global_requires_backward_grad_sync: all-reduces whether this iteration's backward
  // reduces (1 from the ranks that train and will, 0 from joined ranks).
  c10::intrusive_ptr<c10d::Work> global_requires_backward_grad_sync(bool is_joined_rank) {
    auto t = torch::full({1}, !is_joined_rank && require_backward_grad_sync ? 1.0 : 0.0,
                         torch::TensorOptions().device(device()));
    std::vector<at::Tensor> tensors{t};
    return pg->allreduce(tensors);
  }

  // A gradient accumulator of this DDP's parameters ran: at the first of a reducing backward,
  // queue the end-of-backward work. Registered before the reducer's hooks, so this callback comes
  // before the reducer's finalize.
  void on_gradient() {
    std::lock_guard lock(mutex);
    if (!expect_backward || end_queued) return;
    end_queued = true;
    std::weak_ptr<Impl> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto self = weak.lock()) self->end_of_backward();
    });
  }

  void end_of_backward() {
    {
      std::lock_guard lock(mutex);
      expect_backward = false;
      end_queued = false;
    }
#ifdef DDPRUN_WORKER_DIRECT_GLOO
    if (comm) comm->drain();  // the rest of the buckets on this thread, instead of sleeping
#endif
    // After the reducer's own finalize (queued after this one): a training step is complete.
    torch::autograd::Engine::get_default_engine().queue_callback([] { step_completed(); });
  }

  void hook_accumulators(const std::vector<at::Tensor>& params) {
    std::weak_ptr<Impl> weak = weak_from_this();
    for (const auto& p : params) {
      auto acc = torch::autograd::impl::grad_accumulator(p);
      const uintptr_t key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            if (auto self = weak.lock()) self->on_gradient();
            return outputs;
          }));
      hooks.emplace_back(std::move(acc), key);
    }
  }

  void construct(Distributed& dist);
  size_t first_bucket_cap() const;
  // Whether _sync_module_states broadcasts the buffers: on 1.x always, on 2.x with broadcast_buffers.
  bool states_with_buffers() const {
#if TORCH_VERSION_MAJOR >= 2
    return options.broadcast_buffers();
#else
    return true;
#endif
  }
};

}  // namespace ddprun::worker::detail
