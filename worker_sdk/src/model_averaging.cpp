// Model averaging (see model_averaging.hpp), step for step as model_averaging/utils.py.
#include "ddprun/worker/model_averaging.hpp"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace ddprun::worker {

void average_parameters(const std::vector<torch::Tensor>& params,
                        const c10::intrusive_ptr<c10d::ProcessGroup>& process_group) {
  if (!process_group) throw std::invalid_argument("average_parameters: process_group is null");
  std::vector<torch::Tensor> averaged, flat;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;  // get_params_to_average
    averaged.push_back(p);
    flat.push_back(p.detach().reshape(-1));
  }
  if (averaged.empty()) return;  // Python's all-reduce of nothing: nothing to do on any rank
  at::Tensor sum = at::cat(flat);
  sum.div_(process_group->getSize());
  std::vector<at::Tensor> tensors{sum};
  process_group->allreduce(tensors)->wait();
  int64_t offset = 0;
  for (auto& p : averaged) {
    const int64_t n = p.numel();
    p.set_data(sum.narrow(0, offset, n).view_as(p).type_as(p));
    offset += n;
  }
}

PeriodicModelAverager::PeriodicModelAverager(int64_t period, int64_t warmup_steps,
                                             c10::intrusive_ptr<c10d::ProcessGroup> process_group)
    : period_(period), warmup_steps_(warmup_steps), process_group_(std::move(process_group)) {
  if (warmup_steps < 0) throw std::invalid_argument("PeriodicModelAverager: warmup_steps must be non-negative");
  if (period < 1) throw std::invalid_argument("PeriodicModelAverager: period must be positive");
  if (!process_group_) throw std::invalid_argument("PeriodicModelAverager: process_group is null");
}

void PeriodicModelAverager::average_parameters(const std::vector<torch::Tensor>& params) {
  if (step_ >= warmup_steps_ && (step_ - warmup_steps_) % period_ == 0) {
    worker::average_parameters(params, process_group_);
  }
  ++step_;
}

}  // namespace ddprun::worker
