// Python DDP's logic (torch/nn/parallel/distributed.py of the LibTorch release this is built
// against) over LibTorch's c10d::Reducer. Each step below names the Python it stands for.
#include "ddprun/worker/ddp.hpp"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/debug.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

#include "ddp_impl.hpp"

namespace ddprun::worker::detail {
namespace {

constexpr size_t kDefaultBucketCap = 25u << 20;
constexpr size_t kDefaultFirstBucketCap = 1u << 20;  // torch.distributed._DEFAULT_FIRST_BUCKET_BYTES

// c10d::Reducer's constructor as each LibTorch has it. Up to 2.6 the first iteration's per-bucket
// size limits come third; later releases drop them and add two flags Python DDP passes as false
// unless asked (skip_all_reduce_unused_params, use_python_reducer) and the rebuild's cap list. Told apart by the signature, not by a version
// number, so a LibTorch between the two builds either way. R is a template parameter so that only
// the branch this LibTorch has is compiled.
template <typename R = c10d::Reducer>
std::shared_ptr<R> make_reducer(std::vector<at::Tensor> params, std::vector<std::vector<size_t>> bucket_indices,
                                std::vector<size_t> bucket_limits, c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                std::vector<bool> expect_sparse, int64_t bucket_cap, bool find_unused,
                                bool gradient_as_bucket_view, std::unordered_map<size_t, std::string> param_names,
                                int64_t first_bucket_cap) {
  if constexpr (std::is_constructible_v<R, std::vector<at::Tensor>, std::vector<std::vector<size_t>>,
                                        std::vector<size_t>, c10::intrusive_ptr<c10d::ProcessGroup>, std::vector<bool>,
                                        int64_t, bool, bool, std::unordered_map<size_t, std::string>, int64_t>) {
    return std::make_shared<R>(std::move(params), std::move(bucket_indices), std::move(bucket_limits), std::move(pg),
                               std::move(expect_sparse), bucket_cap, find_unused, gradient_as_bucket_view,
                               std::move(param_names), first_bucket_cap);
  } else {
    // The last argument lists per-bucket caps for the rebuild after the first iteration
    // (bucket_cap_mb_list); empty, as Python passes it by default, rebuilds by first_bucket_cap and
    // bucket_cap. The first iteration's limits are implied by bucket_indices.
    (void)bucket_limits;
    return std::make_shared<R>(std::move(params), std::move(bucket_indices), std::move(pg), std::move(expect_sparse),
                               bucket_cap, find_unused, gradient_as_bucket_view, std::move(param_names),
                               first_bucket_cap, /*skip_all_reduce_unused_params=*/false,
                               /*use_python_reducer=*/false, /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  }
}

std::mutex sink_registry_mutex;
std::unordered_map<int64_t, std::weak_ptr<SinkTarget>>& sink_registry() {
  static std::unordered_map<int64_t, std::weak_ptr<SinkTarget>> registry;
  return registry;
}

// Python's _DDPSink: passes the forward's outputs through (cloned) so that its backward runs at the
// start of every backward pass; with a static graph, the first one queues the reducer's delayed
// all-reduce to run once all gradients are computed. Undefined gradients stay undefined.
struct DdpSink : torch::autograd::Function<DdpSink> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, int64_t target,
                                                bool enqueue_delay, at::TensorList inputs) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["target"] = target;
    ctx->saved_data["enqueue_delay"] = enqueue_delay;
    torch::autograd::variable_list out;
    out.reserve(inputs.size());
    for (const auto& t : inputs) out.push_back(t.defined() ? t.clone() : t);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    std::shared_ptr<SinkTarget> target;
    {
      std::lock_guard lock(sink_registry_mutex);
      auto it = sink_registry().find(ctx->saved_data["target"].toInt());
      if (it != sink_registry().end()) target = it->second.lock();
    }
    if (target && ctx->saved_data["enqueue_delay"].toBool()) {
#if TORCH_VERSION_MAJOR >= 2
      // 2.x: once, by the first backward after static_graph was set.
      const bool enqueue = target->static_graph && !target->delay_all_reduce_enqueued.exchange(true);
#else
      // 1.13: every backward of the first iteration's forwards (the forward decided).
      const bool enqueue = true;
#endif
      if (enqueue) {
        std::weak_ptr<c10d::Reducer> weak = target->reducer;
        torch::autograd::Engine::get_default_engine().queue_callback([weak] {
          if (auto reducer = weak.lock()) reducer->delay_all_reduce();
        });
      }
    }
    torch::autograd::variable_list out{at::Tensor(), at::Tensor()};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  }
};

// A C++ function as the reducer's communication hook (Python's PythonCommHook for a callable).
class FunctionCommHook final : public c10d::CommHookInterface {
 public:
  explicit FunctionCommHook(std::function<comm_hooks::TensorFuture(c10d::GradBucket&)> hook) : hook_(std::move(hook)) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    auto future = hook_(bucket);
    if (!future) throw std::runtime_error("DistributedDataParallel: the communication hook returned no future");
    return future;
  }
  at::Tensor parseHookResult(const c10::IValue& result) override {
    if (result.isTensor()) return result.toTensor();
    if (result.isTensorList() && !result.toTensorVector().empty()) return result.toTensorVector()[0];
    throw std::runtime_error(
        "DistributedDataParallel: a communication hook's future must hold a Tensor or a list "
        "of Tensors (the reduced bucket), not " +
        result.tagKind());
  }

 private:
  std::function<comm_hooks::TensorFuture(c10d::GradBucket&)> hook_;
};

}  // namespace

[[noreturn]] void rethrow_clean(const c10::Error& e) {
  throw std::runtime_error("DistributedDataParallel: " + std::string(e.what_without_backtrace()));
}

DdpCore::Impl::~Impl() {
  for (auto& [node, key] : hooks) node->del_post_hook(key);
  std::lock_guard lock(sink_registry_mutex);
  sink_registry().erase(sink_id);
}

size_t DdpCore::Impl::first_bucket_cap() const {
  if (options.first_bucket_cap_bytes()) return *options.first_bucket_cap_bytes();
#if TORCH_VERSION_MAJOR >= 2
  // 2.x: bucket_cap_mb given -> the first bucket has the same cap.
  return options.bucket_cap_bytes() == kDefaultBucketCap ? kDefaultFirstBucketCap : options.bucket_cap_bytes();
#else
  return kDefaultFirstBucketCap;
#endif
}

void DdpCore::Impl::construct(Distributed& dist) {
  ignored.insert(options.params_and_buffers_to_ignore().begin(), options.params_and_buffers_to_ignore().end());

  // _build_params_for_reducer: parameters that require a gradient, module by module, once each.
  std::vector<at::Tensor> params;
  std::vector<bool> expect_sparse;
  for (auto& p : reducer_parameters(*module, ignored)) {
    params.push_back(p.tensor);
    expect_sparse.push_back(p.sparse_gradient);
    parameter_names.push_back(p.name);
  }
  if (params.empty()) {
    throw std::invalid_argument(
        "DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient.");
  }
  std::set<c10::DeviceType> device_types;
  for (const auto& p : params) device_types.insert(p.device().type());
  if (device_types.size() != 1) {
    throw std::invalid_argument(
        "DistributedDataParallel's input module must be on the same type of devices, but its parameters are on "
        "several (move the whole module to one device type first)");
  }
  param_device = params.front().device();

  pg = dist.c10d_group();
#ifdef DDPRUN_WORKER_DIRECT_GLOO
  if (options.direct_gloo() && dist.backend() == "gloo" && dist.world_size() > 1 &&
      c10d::debug_level() != c10d::DebugLevel::Detail) {
    static std::atomic<int> instances{0};  // DDP objects are created in the same order on every rank
    // Auto: spin only when this node's ranks with their intra-op threads fit its CPUs, so a
    // spinning rank never takes a core from one that is still computing.
    const int threads_on_node = dist.env().local_world_size * std::max(1, at::get_num_threads());
    const bool spin = options.busy_poll() == BusyPoll::On ||
                      (options.busy_poll() == BusyPoll::Auto && threads_on_node <= usable_cpus());
    CollectiveWait connecting;
    comm = c10::make_intrusive<DdpCommGroup>(dist.process_group(), dist.store(),
                                             "ddprun/ddp/" + std::to_string(instances++) + "/", dist.timeout(), spin);
    pg = as_c10d_group(comm, dist.store(), dist.device());
  }
#endif

  if (options.init_sync()) {
    // _verify_param_shape_across_processes: every rank stops here, naming the first difference.
    verify_same_parameters(pg, params, parameter_names);
    // _sync_module_states: every parameter (requiring a gradient or not) and, on 1.x always and on
    // 2.x with broadcast_buffers, every buffer.
    broadcast_from(module_states(states_with_buffers()), 0);
  }

  // _build_debug_param_to_name_mapping: names in the reducer's errors with TORCH_DISTRIBUTED_DEBUG.
  std::unordered_map<size_t, std::string> param_names;
  if (c10d::debug_level() != c10d::DebugLevel::Off) {
    for (size_t i = 0; i < parameter_names.size(); ++i) param_names[i] = parameter_names[i];
  }

  // _ddp_init_helper: one bucket for the first iteration unless unused parameters are searched
  // for; the reducer rebuilds them in gradient order after it.
  std::vector<size_t> limits;
  if (options.static_graph() || !options.find_unused_parameters()) {
    limits = {static_cast<size_t>(LLONG_MAX)};  // sys.maxsize
  } else {
    limits = {first_bucket_cap(), options.bucket_cap_bytes()};
  }
  auto [bucket_indices, bucket_limits] = c10d::compute_bucket_assignment_by_size(params, limits, expect_sparse);
  std::reverse(bucket_indices.begin(), bucket_indices.end());
  std::reverse(bucket_limits.begin(), bucket_limits.end());

  hook_accumulators(params);  // before the reducer's hooks: see on_gradient()
  reducer =
      make_reducer(params, std::move(bucket_indices), std::move(bucket_limits), pg, expect_sparse,
                   static_cast<int64_t>(options.bucket_cap_bytes()), options.find_unused_parameters(),
                   options.gradient_as_bucket_view(), std::move(param_names), static_cast<int64_t>(first_bucket_cap()));
  logger = std::make_shared<c10d::Logger>(reducer);
  reducer->set_logger(logger);
  logger->set_construction_data_and_log(module->name(), {}, -1, options.broadcast_buffers(),
                                        /*has_sync_bn=*/false, options.static_graph());
  sink->reducer = reducer;
  {
    static std::atomic<int64_t> next_sink_id{1};
    sink_id = next_sink_id++;
    std::lock_guard lock(sink_registry_mutex);
    sink_registry()[sink_id] = sink;
  }
}

DdpCore::DdpCore(torch::nn::Module& module, Distributed& dist, const DdpOptions& options)
    : impl_(std::make_shared<Impl>()) {
  impl_->module = &module;
  impl_->options = options;
  try {
    impl_->construct(dist);
    if (options.static_graph()) set_static_graph();
  } catch (const c10::Error& e) {
    rethrow_clean(e);
  }
}

DdpCore::~DdpCore() = default;

void DdpCore::pre_forward(Joinable& self) {
  Impl& s = *impl_;
  progress();
  try {
    const bool grad = at::GradMode::is_enabled();
    if (grad && s.require_backward_grad_sync) {
      s.logger->set_runtime_stats_and_log();
      ++s.num_iterations;
      s.reducer->prepare_for_forward();
    }
    // In a Join: tells the joined ranks this one still trains (and how many do, for the divide
    // factor); throws here when another rank ran out and the Join throws on early termination.
    if (auto work = Join::notify_join_context(self)) {
      s.reducer->set_forward_pass_work_handle(work, s.divide_by_initial_world_size);
    }
    // Raises here when the previous iteration's reduction did not finish (a parameter without a
    // gradient and no find_unused_parameters), naming the parameters.
    if (grad) s.reducer->rebuild_buckets();
    const bool joining = self.join_config().enable;
    // In a Join, rank 0 may have joined with stale buffers: the largest rank still training's.
    if (s.will_sync_module_buffers()) s.sync_module_buffers(joining ? s.find_common_rank(true) : 0);
    // The joined ranks learn whether this iteration's backward reduces (not waited for here).
    if (joining) s.global_requires_backward_grad_sync(false);
  } catch (const c10::Error& e) {
    throw std::runtime_error("DistributedDataParallel: " +
                             with_parameter_names(e.what_without_backtrace(), s.parameter_names));
  }
}

bool DdpCore::post_forward(std::vector<at::Tensor>& outputs) {
  Impl& s = *impl_;
  try {
    if (at::GradMode::is_enabled() && s.require_backward_grad_sync) {
      s.require_forward_param_sync = true;
      {
        std::lock_guard lock(s.mutex);
        s.expect_backward = true;
      }
      if (s.options.find_unused_parameters() && !s.static_graph) {
        s.reducer->prepare_for_backward(outputs);
      } else {
        s.reducer->prepare_for_backward({});
      }
    } else {
      s.require_forward_param_sync = false;
    }
  } catch (const c10::Error& e) {
    rethrow_clean(e);
  }

#if TORCH_VERSION_MAJOR >= 2
  const bool first_static = s.static_graph && !s.sink->delay_all_reduce_enqueued;
#else
  const bool first_static = s.static_graph && s.num_iterations == 1;
#endif
  if (!((s.options.find_unused_parameters() && !s.static_graph) || first_static)) return false;
  // Only outputs with a grad_fn are passed through, as Python keeps the others.
  std::vector<size_t> through;
  torch::autograd::variable_list inputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].grad_fn()) {
      through.push_back(i);
      inputs.push_back(outputs[i]);
    }
  }
  if (through.empty()) return false;
  auto passed = DdpSink::apply(s.sink_id, s.static_graph, at::TensorList(inputs));
  for (size_t k = 0; k < through.size(); ++k) outputs[through[k]] = passed[k];
  return true;
}

bool DdpCore::require_backward_grad_sync() const { return impl_->require_backward_grad_sync; }

void DdpCore::set_require_backward_grad_sync(bool on) { impl_->require_backward_grad_sync = on; }

void DdpCore::set_static_graph() {
  Impl& s = *impl_;
  if (s.static_graph) return;  // Python warns and does nothing
  try {
    s.static_graph = true;
    s.sink->static_graph = true;
    s.sink->delay_all_reduce_enqueued = false;
    s.reducer->set_static_graph();
    s.logger->set_static_graph();
  } catch (const c10::Error& e) {
    rethrow_clean(e);
  }
}

c10::DDPLoggingData DdpCore::logging_data() const { return impl_->logger->get_ddp_logging_data(); }

std::vector<std::vector<size_t>> DdpCore::bucket_layout() const {
  return impl_->logger->get_per_bucket_variable_indices();
}

bool DdpCore::direct_gloo() const {
#ifdef DDPRUN_WORKER_DIRECT_GLOO
  return impl_->comm.defined();
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> DdpCore::process_group() const { return impl_->pg; }

void DdpCore::register_comm_hook(std::function<comm_hooks::TensorFuture(c10d::GradBucket&)> hook,
                                 const std::string& name) {
  if (!hook) throw std::invalid_argument("DistributedDataParallel::register_comm_hook: the hook is empty");
  Impl& s = *impl_;
  try {
    s.reducer->register_comm_hook(std::make_unique<FunctionCommHook>(std::move(hook)));
    s.logger->set_comm_hook(name);
  } catch (const c10::Error& e) {
    rethrow_clean(e);
  }
}

}  // namespace ddprun::worker::detail
