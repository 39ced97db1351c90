// Python DDP's logic (torch/nn/parallel/distributed.py of the LibTorch release this is built
// against) over LibTorch's c10d::Reducer. Each step below names the Python it stands for.
#include "ddprun/worker/ddp.hpp"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/debug.h>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/version.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <climits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "ddprun/worker/progress.hpp"
#include "ddp_model.hpp"
#ifdef DDPRUN_WORKER_DIRECT_GLOO
#include "ddp_comm_group.hpp"
#endif

namespace ddprun::worker::detail {
namespace {

constexpr size_t kBroadcastBucketBytes = 250u << 20;  // Python DDP's broadcast_bucket_size
constexpr size_t kDefaultBucketCap = 25u << 20;
constexpr size_t kDefaultFirstBucketCap = 1u << 20;  // torch.distributed._DEFAULT_FIRST_BUCKET_BYTES

// c10::Error's what() carries a C++ backtrace; users get the sentence, as Python shows it.
[[noreturn]] void rethrow_clean(const c10::Error& e) {
  throw std::runtime_error("DistributedDataParallel: " + std::string(e.what_without_backtrace()));
}

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

struct SinkTarget;
std::mutex sink_registry_mutex;
std::unordered_map<int64_t, std::weak_ptr<SinkTarget>>& sink_registry() {
  static std::unordered_map<int64_t, std::weak_ptr<SinkTarget>> registry;
  return registry;
}

// What the output sink's backward needs of its DDP (Python's weakref to the module).
struct SinkTarget {
  std::weak_ptr<c10d::Reducer> reducer;
  std::atomic<bool> static_graph{false};
  std::atomic<bool> delay_all_reduce_enqueued{false};
};

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
  explicit FunctionCommHook(std::function<comm_hooks::TensorFuture(c10d::GradBucket&)> hook)
      : hook_(std::move(hook)) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    auto future = hook_(bucket);
    if (!future) throw std::runtime_error("DistributedDataParallel: the communication hook returned no future");
    return future;
  }
  at::Tensor parseHookResult(const c10::IValue& result) override {
    if (result.isTensor()) return result.toTensor();
    if (result.isTensorList() && !result.toTensorVector().empty()) return result.toTensorVector()[0];
    throw std::runtime_error("DistributedDataParallel: a communication hook's future must hold a Tensor or a list "
                             "of Tensors (the reduced bucket), not " + result.tagKind());
  }

 private:
  std::function<comm_hooks::TensorFuture(c10d::GradBucket&)> hook_;
};

}  // namespace

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

  // Python DDP's state.
  bool require_backward_grad_sync = true;
  bool require_forward_param_sync = true;
  bool static_graph = false;
  int64_t num_iterations = 0;  // 1.13's count, read by the sink
  bool divide_by_initial_world_size = true;  // set by a join hook

  // End of backward, for ddprun's progress signals and the direct path's drain.
  std::mutex mutex;
  bool expect_backward = false;
  bool end_queued = false;

  ~Impl() {
    for (auto& [node, key] : hooks) node->del_post_hook(key);
    std::lock_guard lock(sink_registry_mutex);
    sink_registry().erase(sink_id);
  }

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
    return require_forward_param_sync && options.broadcast_buffers && !buffers().empty();
  }

  void sync_module_buffers(int src) {
    std::vector<at::Tensor> tensors;
    for (auto& b : buffers()) tensors.push_back(b.tensor.detach());
    broadcast_from(tensors, src);
  }

  torch::Device device() const { return reducer_parameters(*module, ignored).front().tensor.device(); }

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
    return options.broadcast_buffers;
#else
    return true;
#endif
  }
};

size_t DdpCore::Impl::first_bucket_cap() const {
  if (options.first_bucket_cap_bytes) return *options.first_bucket_cap_bytes;
#if TORCH_VERSION_MAJOR >= 2
  // 2.x: bucket_cap_mb given -> the first bucket has the same cap.
  return options.bucket_cap_bytes == kDefaultBucketCap ? kDefaultFirstBucketCap : options.bucket_cap_bytes;
#else
  return kDefaultFirstBucketCap;
#endif
}

void DdpCore::Impl::construct(Distributed& dist) {
  ignored.insert(options.params_and_buffers_to_ignore.begin(), options.params_and_buffers_to_ignore.end());

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

  pg = dist.c10d_group();
#ifdef DDPRUN_WORKER_DIRECT_GLOO
  if (options.direct_gloo && dist.backend() == "gloo" && dist.world_size() > 1 &&
      c10d::debug_level() != c10d::DebugLevel::Detail) {
    static std::atomic<int> instances{0};  // DDP objects are created in the same order on every rank
    // Auto: spin only when this node's ranks with their intra-op threads fit its CPUs, so a
    // spinning rank never takes a core from one that is still computing.
    const int threads_on_node = dist.env().local_world_size * std::max(1, at::get_num_threads());
    const bool spin = options.busy_poll == BusyPoll::On ||
                      (options.busy_poll == BusyPoll::Auto && threads_on_node <= usable_cpus());
    CollectiveWait connecting;
    comm = c10::make_intrusive<DdpCommGroup>(dist.process_group(), dist.store(),
                                             "ddprun/ddp/" + std::to_string(instances++) + "/", dist.timeout(), spin);
    pg = as_c10d_group(comm, dist.store(), dist.device());
  }
#endif

  if (options.init_sync) {
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
  if (options.static_graph || !options.find_unused_parameters) {
    limits = {static_cast<size_t>(LLONG_MAX)};  // sys.maxsize
  } else {
    limits = {first_bucket_cap(), options.bucket_cap_bytes};
  }
  auto [bucket_indices, bucket_limits] = c10d::compute_bucket_assignment_by_size(params, limits, expect_sparse);
  std::reverse(bucket_indices.begin(), bucket_indices.end());
  std::reverse(bucket_limits.begin(), bucket_limits.end());

  hook_accumulators(params);  // before the reducer's hooks: see on_gradient()
  reducer = std::make_shared<c10d::Reducer>(params, std::move(bucket_indices), std::move(bucket_limits), pg,
                                            expect_sparse, static_cast<int64_t>(options.bucket_cap_bytes),
                                            options.find_unused_parameters, options.gradient_as_bucket_view,
                                            std::move(param_names), static_cast<int64_t>(first_bucket_cap()));
  logger = std::make_shared<c10d::Logger>(reducer);
  reducer->set_logger(logger);
  logger->set_construction_data_and_log(module->name(), {}, -1, options.broadcast_buffers,
                                        /*has_sync_bn=*/false, options.static_graph);
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
    if (options.static_graph) set_static_graph();
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
      if (s.options.find_unused_parameters && !s.static_graph) {
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
  if (!((s.options.find_unused_parameters && !s.static_graph) || first_static)) return false;
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

namespace {

// Python's _DDPJoinHook: a joined rank's shadow of one DDP iteration, and the final model sync.
class DdpJoinHook final : public JoinHook {
 public:
  DdpJoinHook(std::shared_ptr<DdpCore::Impl> ddp, bool divide_by_initial_world_size) : ddp_(std::move(ddp)) {
    ddp_->logger->set_uneven_input_join();
    ddp_->divide_by_initial_world_size = divide_by_initial_world_size;
  }

  void main_hook() override {
    DdpCore::Impl& s = *ddp_;
    try {
      s.reducer->rebuild_buckets();  // once per training, as the others' forward does
      // The others' buffer broadcast, from the largest rank still training.
      if (s.will_sync_module_buffers()) s.sync_module_buffers(s.find_common_rank(false));
      bool sync_backward = false;
      {
        auto t = torch::zeros({1}, torch::TensorOptions().device(s.device()));
        std::vector<at::Tensor> tensors{t};
        CollectiveWait waiting;
        s.pg->allreduce(tensors)->wait();
        sync_backward = t.item<double>() != 0;
      }
      // No gradient sync this iteration means no buffer broadcast in the next one.
      s.require_forward_param_sync = sync_backward;
      if (!sync_backward) return;
      // One all-reduce of zeros per bucket, in the reducer's order, through the communication hook
      // if one is registered (the divide factor then counts the ranks still training, or not).
      std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
      for (auto& bucket : s.reducer->get_grad_buckets(/*return_zero_tensors=*/true)) {
        futures.push_back(s.reducer->run_comm_hook(bucket));
      }
      {
        CollectiveWait waiting;
#ifdef DDPRUN_WORKER_DIRECT_GLOO
        if (s.comm) s.comm->drain();
#endif
        for (auto& f : futures) {
          f->wait();
          if (f->hasError()) std::rethrow_exception(f->exception_ptr());
        }
      }
      if (s.options.find_unused_parameters) {  // the others' map of used parameters
        std::vector<at::Tensor> tensors{s.reducer->get_local_used_map_on_device()};
        CollectiveWait waiting;
        s.pg->allreduce(tensors)->wait();
      }
      s.reducer->push_rebuilt_params_for_all_indices();
    } catch (const c10::Error& e) {
      rethrow_clean(e);
    }
  }

  // _sync_final_model: every rank takes the model of the largest of the last ranks to join.
  void post_hook(bool is_last_joiner) override {
    DdpCore::Impl& s = *ddp_;
    try {
      const int src = s.find_common_rank(is_last_joiner);
      s.broadcast_from(s.module_states(s.states_with_buffers()), src);
    } catch (const c10::Error& e) {
      rethrow_clean(e);
    }
  }

 private:
  std::shared_ptr<DdpCore::Impl> ddp_;
};

}  // namespace

std::unique_ptr<JoinHook> DdpCore::join_hook(const JoinOptions& options) {
  return std::make_unique<DdpJoinHook>(impl_, options.divide_by_initial_world_size);
}

torch::Device DdpCore::device() const { return impl_->device(); }

}  // namespace ddprun::worker::detail
