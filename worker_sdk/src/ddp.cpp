#include "ddprun/worker/ddp.hpp"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/utils/tensor_flatten.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "bucket_plan.hpp"
#ifdef DDPRUN_WORKER_DIRECT_GLOO
#include "gloo_reducer.hpp"
#endif

namespace ddprun::worker::detail {
#ifdef DDPRUN_WORKER_DIRECT_GLOO
namespace {

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace
#endif

void broadcast_coalesced(CommGroup& pg, const std::vector<torch::Tensor>& tensors) {
  if (pg.getSize() == 1 || tensors.empty()) return;
  // One collective per dtype/device group instead of one per tensor.
  std::map<std::pair<int, std::string>, std::vector<torch::Tensor>> groups;
  for (const auto& t : tensors) groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  for (auto& [key, group] : groups) {
    std::vector<torch::Tensor> flat{torch::utils::flatten_dense_tensors(group)};
    {
      CollectiveWait waiting;
      pg.broadcast(flat)->wait();
    }
    auto pieces = torch::utils::unflatten_dense_tensors(flat[0], group);
    for (size_t i = 0; i < group.size(); ++i) group[i].copy_(pieces[i]);
  }
}

struct GradientReducer::State {
  struct Param {
    std::string name;
    torch::Tensor tensor;
    size_t bucket = 0;
    int64_t offset = 0;  // in elements, within the bucket's flat tensor
    bool ready = false;
  };
  struct Bucket {
    std::vector<size_t> params;
    torch::Tensor flat;
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;  // when reduced through the process group
    std::optional<size_t> gloo_id;        // when reduced through the direct Gloo reducer
  };

  c10::intrusive_ptr<CommGroup> pg;
  int world_size = 1;
#ifdef DDPRUN_WORKER_DIRECT_GLOO
  std::unique_ptr<GlooBucketReducer> gloo;
#endif
  DdpOptions options;
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keep the hooked nodes alive
  std::mutex mutex;
  bool sync = true;
  bool in_backward = false;
  size_t next_bucket = 0;
  std::string error;

  void reset_pass() {
    for (auto& p : params) p.ready = false;
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.work.reset();
    }
    next_bucket = 0;
    in_backward = false;
  }

  // Starts every consecutive ready bucket: all ranks launch buckets in the same order, whatever
  // order their hooks fire in. in_backward_pass=false: the caller waits right after (end of
  // backward), so queued direct-Gloo buckets are left for it rather than the background thread.
  void launch_ready(bool in_backward_pass = true) {
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      Bucket& b = buckets[next_bucket++];
      b.flat.div_(world_size);
#ifdef DDPRUN_WORKER_DIRECT_GLOO
      if (b.gloo_id) {
        gloo->launch(*b.gloo_id, in_backward_pass);
        continue;
      }
#endif
      std::vector<torch::Tensor> ts{b.flat};
      b.work = pg->allreduce(ts);
    }
  }

  // One flat tensor per planned bucket; each parameter learns its bucket and offset.
  void build_buckets(std::vector<std::vector<size_t>> layout) {
    for (auto& indices : layout) {
      Bucket b;
      int64_t numel = 0;
      for (size_t i : indices) {
        params[i].bucket = buckets.size();
        params[i].offset = numel;
        numel += params[i].tensor.numel();
      }
      b.flat = torch::zeros({numel}, params[indices.front()].tensor.options().requires_grad(false));
      b.params = std::move(indices);
      buckets.push_back(std::move(b));
    }
  }

#ifdef DDPRUN_WORKER_DIRECT_GLOO
  // CPU float/double buckets of a Gloo job go through the direct reducer (see gloo_reducer.hpp).
  // Every rank has the same buckets, so every rank makes the same choice.
  void attach_direct_gloo(const Distributed& dist) {
    auto direct = [](const torch::Tensor& t) {
      return t.device().is_cpu() && (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble);
    };
    if (std::none_of(buckets.begin(), buckets.end(), [&](const Bucket& b) { return direct(b.flat); })) return;
    static std::atomic<int> instances{0};  // DDP objects are created in the same order on every rank
    // Auto: spin only when this node's ranks with their intra-op threads fit its CPUs, so a
    // spinning rank never takes a core from one that is still computing.
    const int threads_on_node = dist.env().local_world_size * std::max(1, at::get_num_threads());
    const bool spin = options.busy_poll == BusyPoll::On ||
                      (options.busy_poll == BusyPoll::Auto && threads_on_node <= usable_cpus());
    gloo = std::make_unique<GlooBucketReducer>(dist.store(), "ddprun/ddp/" + std::to_string(instances++) + "/",
                                               dist.rank(), world_size, dist.timeout(), spin);
    for (auto& b : buckets) {  // a bucket the reducer cannot take stays on the process group
      if (!direct(b.flat)) continue;
      const auto count = static_cast<size_t>(b.flat.numel());
      b.gloo_id = b.flat.scalar_type() == torch::kFloat ? gloo->add(b.flat.data_ptr<float>(), count)
                                                        : gloo->add(b.flat.data_ptr<double>(), count);
    }
  }
#endif

  // Hooks each parameter's AccumulateGrad node: it fires after the gradient is accumulated.
  void hook_accumulators(const std::shared_ptr<State>& self) {
    std::weak_ptr<State> weak = self;
    for (size_t i = 0; i < params.size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(params[i].tensor);
      acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            if (auto st = weak.lock()) st->on_grad_ready(i);
            return outputs;
          }));
      accumulators.push_back(std::move(acc));
    }
  }

  void wait_launched() {
#ifdef DDPRUN_WORKER_DIRECT_GLOO
    if (gloo) gloo->wait_all();
#endif
    for (auto& b : buckets) {
      if (b.work) b.work->wait();
    }
  }

  void on_grad_ready(size_t index) {
    std::lock_guard lock(mutex);
    if (!in_backward) {
      in_backward = true;
      // Runs once the whole backward pass is done.
      torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
    }
    if (!sync || world_size == 1) return;  // one process: the local gradients are the result
    Param& p = params[index];
    if (p.ready) return;
    p.ready = true;
    Bucket& b = buckets[p.bucket];
    auto slice = b.flat.narrow(0, p.offset, p.tensor.numel());
    const auto& grad = p.tensor.grad();
    if (grad.defined()) slice.copy_(grad.reshape(-1));
    else slice.zero_();
    if (--b.pending == 0) launch_ready();
  }

  void finalize() {
    std::lock_guard lock(mutex);
    if (!sync || world_size == 1) {
      // Nothing to reduce: an accumulation step (no_sync) is a beat, a single process's a step.
      in_backward = false;
      if (world_size == 1 && sync) step_completed();
      else progress();
      return;
    }
    std::vector<size_t> unused_indices;
    for (auto& b : buckets) {
      for (size_t i : b.params) {
        if (params[i].ready) continue;
        if (!options.find_unused_parameters) {
          unused_indices.push_back(i);
          continue;
        }
        params[i].ready = true;
        b.flat.narrow(0, params[i].offset, params[i].tensor.numel()).zero_();
        --b.pending;
      }
    }
    if (!unused_indices.empty()) {
      std::sort(unused_indices.begin(), unused_indices.end());  // registration order
      std::string unused;
      for (size_t i : unused_indices) unused += (unused.empty() ? "" : ", ") + params[i].name;
      // Finish the buckets that did launch so no collective is left half done on this rank.
      {
        CollectiveWait waiting;
        wait_launched();
      }
      reset_pass();
      throw std::runtime_error(
          "DistributedDataParallel: these parameters got no gradient in this step, so their gradients "
          "cannot be reduced: " + unused +
          ". Use them in the forward pass, set requires_grad(false) on them, or set "
          "DdpOptions::find_unused_parameters = true");
    }
    launch_ready(false);
    {
      CollectiveWait waiting;
      wait_launched();
    }
    for (auto& b : buckets) {
      for (size_t i : b.params) {
        Param& p = params[i];
        auto averaged = b.flat.narrow(0, p.offset, p.tensor.numel()).view_as(p.tensor);
        if (p.tensor.grad().defined()) {
          p.tensor.mutable_grad().copy_(averaged);
        } else {
          p.tensor.mutable_grad() = averaged.clone();
        }
      }
    }
    reset_pass();
    step_completed();
  }
};

GradientReducer::GradientReducer(std::vector<std::pair<std::string, torch::Tensor>> named_params,
                                 const Distributed& dist, const DdpOptions& options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.pg = dist.process_group();
  s.world_size = dist.world_size();
  s.options = options;
  for (auto& [name, t] : named_params) s.params.push_back({name, t});
  std::vector<BucketParam> sizes;
  for (const auto& p : s.params) {
    sizes.push_back({static_cast<int>(p.tensor.scalar_type()), p.tensor.device().str(),
                     static_cast<size_t>(p.tensor.numel()) * p.tensor.element_size()});
  }
  s.build_buckets(plan_buckets(sizes, options.first_bucket_cap_bytes, options.bucket_cap_bytes));
  s.reset_pass();
#ifdef DDPRUN_WORKER_DIRECT_GLOO
  if (options.direct_gloo && dist.backend() == "gloo" && s.world_size > 1) s.attach_direct_gloo(dist);
#endif
  s.hook_accumulators(state_);
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::set_sync(bool enabled) {
  std::lock_guard lock(state_->mutex);
  state_->sync = enabled;
}

bool GradientReducer::sync_enabled() const {
  std::lock_guard lock(state_->mutex);
  return state_->sync;
}

bool GradientReducer::direct_gloo() const {
#ifdef DDPRUN_WORKER_DIRECT_GLOO
  return state_->gloo != nullptr;
#else
  return false;
#endif
}

std::vector<std::vector<size_t>> GradientReducer::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : state_->buckets) out.push_back(b.params);
  return out;
}

}  // namespace ddprun::worker::detail
