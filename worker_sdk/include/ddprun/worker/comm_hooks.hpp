#pragma once
// DDP communication hooks: how DistributedDataParallel reduces each bucket of gradients, as
// Python's DistributedDataParallel.register_comm_hook and the hooks of
// torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py define it.
//
// A hook receives the bucket (c10d::GradBucket: its index, its flat buffer of gradients, which are
// the local sums and not yet divided by the world size, its parameters and their gradients as
// views of the buffer, whether it is the last bucket) and returns a future whose value is the
// reduced buffer (a Tensor, or a list whose first element is it). DDP writes that tensor back
// into the parameters' gradients when backward ends. Hooks run on LibTorch's autograd threads
// while backward still runs, one call per bucket in the reducer's bucket order, which is the same
// on every rank: a hook must issue the same collectives in the same order on every rank.
//
// Register one with DistributedDataParallel::register_comm_hook(state, hook) or, for the built-in
// ones, register_comm_hook(comm_hooks::Builtin::fp16_compress).

#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>

namespace ddprun::worker::comm_hooks {

using TensorFuture = c10::intrusive_ptr<c10::ivalue::Future>;
using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

// default_hooks.allreduce_hook: divides the buffer by the group's size in place, then sums it
// over the group. The same averages as DDP without a hook, up to rounding: DDP without a hook
// multiplies each gradient by 1/size as it enters the bucket; this divides (the same bits when
// the size is a power of two).
TensorFuture allreduce_hook(const ProcessGroupPtr& group, c10d::GradBucket& bucket);

// default_hooks.fp16_compress_hook: the buffer cast to float16 and divided by the group's size,
// summed in float16 (half the bytes on the wire), then copied back into the buffer.
TensorFuture fp16_compress_hook(const ProcessGroupPtr& group, c10d::GradBucket& bucket);

// default_hooks.bf16_compress_hook: the same in bfloat16 (float32's range, 8 bits of mantissa).
// Python DDP refuses it without CUDA 11 and NCCL 2.10; here it also runs on CPU: on the direct
// Gloo ring, or on ProcessGroupGloo of PyTorch 2.x (1.13's has no bfloat16 sum: an error that
// says so).
TensorFuture bf16_compress_hook(const ProcessGroupPtr& group, c10d::GradBucket& bucket);

// PowerSGD (Vogels et al., 2019), as torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py
// defines it: each bucket's matrices M (a gradient viewed as rows by the rest) are sent as two
// thin factors P = M Q and Q = M^T P of `matrix_approximation_rank` columns, with the error of
// the approximation fed back into the next step's gradient. The fields and their defaults are
// Python's PowerSGDState's; so are the random start of Q (numpy's RandomState(random_seed)
// drawing a torch seed, which std::mt19937 reproduces), the order of the collectives and the
// arithmetic, so that the same model, data and seed give the same parameters as Python's hook.
//
// PowerSGDState's constructor arguments after the process group, with Python's defaults, set as
// LibTorch's options are: PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(10).
struct PowerSGDOptions {
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  TORCH_ARG(double, min_compression_rate) = 2;
  TORCH_ARG(bool, use_error_feedback) = true;
  TORCH_ARG(bool, warm_start) = true;
  TORCH_ARG(double, orthogonalization_epsilon) = 0;
  TORCH_ARG(uint32_t, random_seed) = 0;
  TORCH_ARG(bool, batch_tensors_with_same_shape) = false;
};

struct PowerSGDState {
  // Throws std::invalid_argument, as Python's constructor raises ValueError, when error feedback
  // or warm start is on and start_powerSGD_iter <= 1 (DDP rebuilds its buckets after iteration 1).
  explicit PowerSGDState(ProcessGroupPtr process_group, const PowerSGDOptions& options = {});

  ProcessGroupPtr process_group;
  int64_t matrix_approximation_rank;
  int64_t start_powerSGD_iter;  // vanilla all-reduce (allreduce_hook) before this iteration
  double min_compression_rate;  // a matrix is compressed when (n + m) * rank * this < n * m
  bool use_error_feedback;
  bool warm_start;  // keep P and Q from step to step (Q is not drawn anew)
  double orthogonalization_epsilon;
  bool batch_tensors_with_same_shape;
  std::mt19937 rng;  // numpy's RandomState(random_seed): MT19937 seeded the same way
  std::map<size_t, at::Tensor> error_dict, p_memory_dict, q_memory_dict;  // by bucket index
  int64_t iter = 0;
  int64_t total_numel_before_compression = 0;
  int64_t total_numel_after_compression = 0;

  // Python's compression_stats(): (before / after, before, after); the rate is 0 before any compression.
  struct CompressionStats {
    double rate;
    int64_t numel_before;
    int64_t numel_after;
  };
  CompressionStats compression_stats() const;
  // numpy's RandomState.randint(high) for 0 < high <= 2^32: masked rejection on 32-bit draws.
  uint32_t randint(uint32_t high);
  void maybe_increase_iter(const c10d::GradBucket& bucket);
};
using PowerSGDStatePtr = std::shared_ptr<PowerSGDState>;

// powerSGD_hook: layer by layer; vectors (and matrices not worth it) are all-reduced as they are.
// Register it with ddp.register_comm_hook(std::make_shared<PowerSGDState>(group, options), powerSGD_hook,
// "powerSGD_hook"). Its collectives run one after another on the autograd thread that calls it.
TensorFuture powerSGD_hook(const PowerSGDStatePtr& state, c10d::GradBucket& bucket);
// batched_powerSGD_hook: the whole bucket as one square matrix (zero-padded). Faster, coarser.
TensorFuture batched_powerSGD_hook(const PowerSGDStatePtr& state, c10d::GradBucket& bucket);

// Post-local SGD (post_localSGD_hook.py, with PeriodicModelAverager of model_averaging.hpp):
// gradients are averaged over `process_group` (allreduce_hook) for the first start_localSGD_iter
// iterations, then over `subgroup` only (e.g. the node's ranks: Distributed::new_subgroups()), or
// not at all without post_local_gradient_allreduce; the averager brings the models together.
struct PostLocalSGDState {
  // Throws std::invalid_argument without a process group or subgroup (Python makes one from the
  // CUDA devices when it is None; make it with Distributed::new_subgroups()).
  PostLocalSGDState(ProcessGroupPtr process_group, ProcessGroupPtr subgroup, int64_t start_localSGD_iter,
                    bool post_local_gradient_allreduce = true);

  ProcessGroupPtr process_group;
  ProcessGroupPtr subgroup;
  int64_t start_localSGD_iter;
  bool post_local_gradient_allreduce;
  int64_t iter = 0;

  void maybe_increase_iter(const c10d::GradBucket& bucket);
};
using PostLocalSGDStatePtr = std::shared_ptr<PostLocalSGDState>;

TensorFuture post_localSGD_hook(const PostLocalSGDStatePtr& state, c10d::GradBucket& bucket);

enum class Builtin { allreduce, fp16_compress, bf16_compress };

using GroupHook = TensorFuture (*)(const ProcessGroupPtr&, c10d::GradBucket&);
GroupHook function_of(Builtin hook);
// Python's name of the hook ("fp16_compress_hook"), which DDP's logging data reports.
std::string name_of(Builtin hook);
// The command-line spelling ("allreduce", "fp16", "bf16") of a built-in hook. Throws
// std::invalid_argument that lists the choices.
Builtin parse_builtin(const std::string& text);

}  // namespace ddprun::worker::comm_hooks
