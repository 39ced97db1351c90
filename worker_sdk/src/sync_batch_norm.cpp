// SyncBatchNorm's statistics over the ranks (see sync_batch_norm.hpp). The steps are those of
// torch/nn/modules/_functions.py's SyncBatchNorm function: on CUDA tensors with the same kernels
// (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt, batch_norm_backward_reduce,
// batch_norm_backward_elemt), on the CPU, where Python refuses to run and those kernels do not exist,
// with ATen's generic operations.
#include "ddprun/worker/sync_batch_norm.hpp"

#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/init.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace ddprun::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

// Every dimension but the channels'.
std::vector<int64_t> reduced_dims(const torch::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast over x ([1, C, 1, ...]).
torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  return v.view(shape);
}

struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor input, const torch::Tensor& weight,
                               const torch::Tensor& bias, const torch::Tensor& running_mean,
                               const torch::Tensor& running_var, double eps, double momentum,
                               const ProcessGroupPtr& group) {
    input = input.contiguous();
    const int64_t channels = input.size(1);
    const int world = group->getSize();
    // This rank's mean, biased variance and count per channel (computed in the input's type, as
    // batch_norm_stats does; combined in double).
    const auto stats_options = input.options().dtype(torch::kDouble);
    torch::Tensor local = torch::zeros({2 * channels + 1}, stats_options);
    if (input.numel() > 0) {
      const auto [var, mean] = at::var_mean(input, reduced_dims(input), /*unbiased=*/false);
      local.narrow(0, 0, channels).copy_(mean);
      local.narrow(0, channels, channels).copy_(var);
      local[2 * channels] = static_cast<double>(input.numel() / channels);
    }
    std::vector<torch::Tensor> inputs{local};
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int r = 0; r < world; ++r) outputs[0].push_back(torch::empty_like(local));
    group->allgather(outputs, inputs)->wait();
    const torch::Tensor all = torch::stack(outputs[0]);  // [world, 2C + 1]
    const torch::Tensor counts = all.select(1, 2 * channels).unsqueeze(1);
    const double total = counts.sum().item<double>();
    if (total <= 1) {
      throw std::invalid_argument("SyncBatchNorm: expected more than 1 value per channel when training, got " +
                                  std::to_string(static_cast<int64_t>(total)) + " over all ranks");
    }
    // The whole batch's statistics: ranks with no values weigh nothing.
    const torch::Tensor means = all.narrow(1, 0, channels), vars = all.narrow(1, channels, channels);
    const torch::Tensor mean = (counts * means).sum(0) / total;
    const torch::Tensor var = (counts * (vars + (means - mean).pow(2))).sum(0) / total;
    const torch::Tensor invstd = (var + eps).rsqrt();
    {
      torch::NoGradGuard no_grad;
      if (running_mean.defined()) {
        running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      }
      if (running_var.defined()) {
        running_var.mul_(1 - momentum).add_((var * (total / (total - 1))).to(running_var.scalar_type()), momentum);
      }
    }
    const torch::Tensor mean_x = mean.to(input.scalar_type()), invstd_x = invstd.to(input.scalar_type());
    ctx->save_for_backward({input, weight, mean_x, invstd_x});
    ctx->saved_data["count"] = total;
    ctx->saved_data["group"] = c10::IValue(group);
    if (input.numel() == 0) return torch::empty_like(input);
    // out = x * alpha + beta, alpha = invstd * weight, beta = bias - mean * alpha: BatchNorm's form.
    torch::Tensor alpha = weight.defined() ? invstd_x * weight : invstd_x;
    torch::Tensor beta = -mean_x * alpha;
    if (bias.defined()) beta = beta + bias;
    return input * per_channel(alpha, input) + per_channel(beta, input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& mean = saved[2];
    const torch::Tensor& invstd = saved[3];
    const double total = ctx->saved_data["count"].toDouble();
    const auto group = ctx->saved_data["group"].toCustomClass<c10d::ProcessGroup>();
    const int64_t channels = input.size(1);
    const torch::Tensor grad_out = grad_outputs[0].contiguous();
    torch::Tensor sum_dy = torch::zeros({channels}, input.options());
    torch::Tensor sum_dy_xmu = torch::zeros({channels}, input.options());
    torch::Tensor xmu;
    if (input.numel() > 0) {
      const auto dims = reduced_dims(input);
      xmu = input - per_channel(mean, input);
      sum_dy = grad_out.sum(dims);
      sum_dy_xmu = (grad_out * xmu).sum(dims);
    }
    torch::Tensor grad_input, grad_weight, grad_bias;
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = sum_dy_xmu * invstd;
    if (ctx->needs_input_grad(2)) grad_bias = sum_dy.clone();
    if (ctx->needs_input_grad(0)) {
      // The whole batch's sums: every rank whose input needs a gradient takes part, as in Python.
      std::vector<torch::Tensor> combined{torch::cat({sum_dy, sum_dy_xmu})};
      group->allreduce(combined)->wait();
      const torch::Tensor mean_dy = combined[0].narrow(0, 0, channels) / total;
      const torch::Tensor mean_dy_xmu = combined[0].narrow(0, channels, channels) / total;
      if (input.numel() == 0) {
        grad_input = torch::zeros_like(input);
      } else {
        const torch::Tensor scale = weight.defined() ? invstd * weight : invstd;
        grad_input =
            (grad_out - per_channel(mean_dy, input) - xmu * per_channel(invstd * invstd * mean_dy_xmu, input)) *
            per_channel(scale, input);
      }
    }
    // One gradient per argument of forward: input, weight, bias, running_mean, running_var, eps,
    // momentum, group.
    return {grad_input,      grad_weight,     grad_bias,       torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// On CUDA tensors: torch/nn/modules/_functions.py's SyncBatchNorm step for step, with the same
// CUDA kernels (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt,
// batch_norm_backward_reduce, batch_norm_backward_elemt), so a CUDA model gets Python's bits.
struct SyncBatchNormCudaFunction : torch::autograd::Function<SyncBatchNormCudaFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor input, torch::Tensor weight,
                               const torch::Tensor& bias, const torch::Tensor& running_mean,
                               const torch::Tensor& running_var, double eps, double momentum,
                               const ProcessGroupPtr& group) {
    if (!input.is_contiguous(at::MemoryFormat::ChannelsLast) &&
        !input.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
      input = input.contiguous();
    }
    if (weight.defined()) weight = weight.contiguous();
    const int64_t channels = input.size(1);
    const int world = group->getSize();
    torch::Tensor combined;
    if (input.numel() > 0) {
      const auto [mean, invstd] = at::batch_norm_stats(input, eps);
      const auto count = torch::full({1}, static_cast<double>(input.numel() / input.size(1)), mean.options());
      combined = torch::cat({mean, invstd, count}, 0);
    } else {
      // An empty input still takes part in the gather; its zero count filters it out below.
      combined = torch::zeros({2 * channels + 1}, input.options());
    }
    std::vector<torch::Tensor> inputs{combined};
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int r = 0; r < world; ++r) outputs[0].push_back(torch::empty_like(combined));
    group->allgather(outputs, inputs)->wait();
    const torch::Tensor all = torch::stack(outputs[0], 0);  // [world, 2C + 1]
    auto parts = torch::split(all, channels, 1);
    torch::Tensor mean_all = parts[0], invstd_all = parts[1], count_all = parts[2];
    const torch::Tensor mask = count_all.squeeze(-1) >= 1;  // ranks with values only
    count_all = count_all.index({mask});
    mean_all = mean_all.index({mask});
    invstd_all = invstd_all.index({mask});
    torch::Tensor counts = count_all.view(-1);
    if (running_mean.defined() && counts.scalar_type() != running_mean.scalar_type()) {
      counts = counts.to(running_mean.scalar_type());
    }
    const auto [mean, invstd] = at::batch_norm_gather_stats_with_counts(input, mean_all, invstd_all, running_mean,
                                                                        running_var, momentum, eps, counts);
    ctx->save_for_backward({input, weight, mean, invstd, count_all.to(torch::kInt32)});
    ctx->saved_data["group"] = c10::IValue(group);
    if (input.numel() == 0) return torch::empty_like(input);
    return at::batch_norm_elemt(input, weight, bias, mean, invstd, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    torch::Tensor grad_out = grad_outputs[0];
    if (!grad_out.is_contiguous(at::MemoryFormat::ChannelsLast) &&
        !grad_out.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
      grad_out = grad_out.contiguous();
    }
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &input = saved[0], &mean = saved[2], &invstd = saved[3], &count = saved[4];
    torch::Tensor weight = saved[1];
    const auto group = ctx->saved_data["group"].toCustomClass<c10d::ProcessGroup>();
    torch::Tensor grad_input, grad_weight, grad_bias;
    if (input.numel() > 0) {
      auto [sum_dy, sum_dy_xmu, gw, gb] =
          at::batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, ctx->needs_input_grad(0),
                                         ctx->needs_input_grad(1), ctx->needs_input_grad(2));
      if (ctx->needs_input_grad(0)) {
        const int64_t channels = sum_dy.size(0);
        std::vector<torch::Tensor> combined{torch::cat({sum_dy, sum_dy_xmu}, 0)};
        group->allreduce(combined)->wait();
        auto sums = torch::split(combined[0], channels);
        if (weight.defined() && weight.scalar_type() != mean.scalar_type()) weight = weight.to(mean.scalar_type());
        grad_input = at::batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sums[0], sums[1], count);
      }
      if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = gw;
      if (weight.defined() && ctx->needs_input_grad(2)) grad_bias = gb;
    } else if (ctx->needs_input_grad(0)) {
      // No values here, but the peers wait for this rank's part of the sum.
      std::vector<torch::Tensor> combined{torch::zeros({2 * input.size(1)}, input.options())};
      group->allreduce(combined)->wait();
    }
    return {grad_input,      grad_weight,     grad_bias,       torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_, ProcessGroupPtr process_group)
    : options(options_), process_group_(std::move(process_group)) {
  reset();
}

void SyncBatchNormImpl::reset() {
  if (options.affine()) {
    weight = register_parameter("weight", torch::empty({options.num_features()}));
    bias = register_parameter("bias", torch::empty({options.num_features()}));
  } else {
    weight = register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({options.num_features()}));
    running_var = register_buffer("running_var", torch::ones({options.num_features()}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (options.track_running_stats()) {
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    torch::nn::init::ones_(weight);
    torch::nn::init::zeros_(bias);
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "ddprun::worker::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats() << ")";
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  if (input.dim() < 2 || input.dim() > 5) {
    throw std::invalid_argument("SyncBatchNorm: expected an input of 2 to 5 dimensions (batch, channels, ...), got " +
                                std::to_string(input.dim()));
  }
  if (input.size(1) != options.num_features()) {
    throw std::invalid_argument("SyncBatchNorm: the input has " + std::to_string(input.size(1)) +
                                " channels, the module " + std::to_string(options.num_features()));
  }
  // BatchNorm's momentum rules (torch/nn/modules/batchnorm.py, LibTorch's BatchNormImplBase).
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum().has_value()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  const bool bn_training = is_training() || !options.track_running_stats();
  const bool sync = bn_training && is_training() && process_group_ && process_group_->getSize() > 1;
  if (!sync) {
    return torch::nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias, bn_training,
                                                     factor, options.eps());
  }
  // In training the running statistics are updated only when tracked (None otherwise, as in Python).
  const torch::Tensor rm = options.track_running_stats() ? running_mean : torch::Tensor();
  const torch::Tensor rv = options.track_running_stats() ? running_var : torch::Tensor();
  if (input.is_cuda()) {
    return SyncBatchNormCudaFunction::apply(input, weight, bias, rm, rv, options.eps(), factor, process_group_);
  }
  return SyncBatchNormFunction::apply(input, weight, bias, rm, rv, options.eps(), factor, process_group_);
}

size_t set_sync_batch_norm_group(torch::nn::Module& module, const ProcessGroupPtr& process_group) {
  size_t count = 0;
  if (auto* own = dynamic_cast<SyncBatchNormImpl*>(&module)) {
    own->set_process_group(process_group);
    ++count;
  }
  for (const auto& child : module.modules(/*include_self=*/false)) {
    if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(child.get())) {
      sync->set_process_group(process_group);
      ++count;
    }
  }
  return count;
}

}  // namespace ddprun::worker
