#pragma once
// Model averaging, as torch/distributed/algorithms/model_averaging/ (averagers.py, utils.py)
// defines it: the companion of post-local SGD (comm_hooks::post_localSGD_hook), which stops
// averaging gradients over the world after its start iteration.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace ddprun::worker {

// utils.average_parameters over the parameters that have a gradient: concatenated, divided by
// the group's size, summed over the group; each parameter's data then becomes its slice of the
// result, as Python's `p.data = ...` does (the parameter objects, and an optimizer's state keyed
// by them, stay the same).
void average_parameters(const std::vector<torch::Tensor>& params,
                        const c10::intrusive_ptr<c10d::ProcessGroup>& process_group);

// averagers.PeriodicModelAverager: average_parameters every `period` steps once `warmup_steps`
// steps have passed (steps counted by calls). Call it after the optimizer's step.
class PeriodicModelAverager {
 public:
  // Throws std::invalid_argument for period < 1 or warmup_steps < 0, as Python raises ValueError.
  PeriodicModelAverager(int64_t period, int64_t warmup_steps, c10::intrusive_ptr<c10d::ProcessGroup> process_group);

  void average_parameters(const std::vector<torch::Tensor>& params);
  int64_t step() const { return step_; }
  int64_t period() const { return period_; }
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  int64_t period_;
  int64_t warmup_steps_;
  c10::intrusive_ptr<c10d::ProcessGroup> process_group_;
  int64_t step_ = 0;
};

}  // namespace ddprun::worker
