#pragma once
// SyncBatchNorm: batch normalisation over the batch of every rank, as Python's
// torch.nn.SyncBatchNorm (torch/nn/modules/batchnorm.py and _functions.py) defines it.
//
// In training, each rank computes its per-channel mean and biased variance and its count of
// values; the ranks all-gather them and every rank combines them into the statistics of the whole
// batch (ranks with an empty batch count for nothing), normalises its own part with them and
// updates the running statistics with the unbiased variance of the whole batch. Backward sums the
// per-channel sums of dy and dy * (x - mean) over the ranks (one all-reduce) for the input's
// gradient; the weight and bias gradients stay the rank's own (DDP averages them, as for every
// parameter). So N ranks with batches b_1..b_N give the output, input gradient and running
// statistics of BatchNorm on one process over the concatenated batch, and the weight and bias
// gradients whose sum over the ranks is that BatchNorm's.
//
// Python runs SyncBatchNorm on CUDA only; this one runs wherever the group's collectives do (CPU
// with Gloo, CUDA with NCCL), with ATen's generic operations rather than the CUDA-only fused
// kernels. In evaluation, without a group, or with a group of one it is BatchNorm exactly.
//
// The state dict's keys are BatchNorm's (weight, bias, running_mean, running_var,
// num_batches_tracked), so checkpoints move between the two. Python's convert_sync_batchnorm
// swaps module objects in place; a C++ module calls its children through typed members, which a
// swap in the module tree would not reach (LibTorch's Module::replace_module says the same), so in
// C++ declare SyncBatchNorm where Python would convert, and give it its group with
// set_sync_batch_norm_group(model, group) (no group: plain BatchNorm).

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstddef>
#include <ostream>

namespace ddprun::worker {

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                             c10::intrusive_ptr<c10d::ProcessGroup> process_group = {});

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  // Inputs of 2 to 5 dimensions, channels in dimension 1 (BatchNorm1d, 2d and 3d's inputs).
  torch::Tensor forward(const torch::Tensor& input);

  // The group whose ranks share the statistics (e.g. Distributed::c10d_group(), or a subgroup).
  void set_process_group(c10::intrusive_ptr<c10d::ProcessGroup> process_group) {
    process_group_ = std::move(process_group);
  }
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return process_group_; }

  torch::nn::BatchNormOptions options;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> process_group_;
};
TORCH_MODULE(SyncBatchNorm);

// Gives every SyncBatchNorm in `module`'s tree (itself included) `process_group`; returns how many.
size_t set_sync_batch_norm_group(torch::nn::Module& module,
                                 const c10::intrusive_ptr<c10d::ProcessGroup>& process_group);

}  // namespace ddprun::worker
