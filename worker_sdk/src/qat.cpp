// Quantization-aware training modules (see qat.hpp). Every forward is the operation sequence of
// PyTorch's Python modules, so the two agree to the bit on the same weights and data:
// torch/ao/quantization/fake_quantize.py (FusedMovingAvgObsFakeQuantize.forward),
// torch/ao/nn/qat/modules/{linear,conv}.py, torch/ao/nn/intrinsic/qat/modules/{linear_relu,conv_fused}.py.
#include "ddprun/worker/qat.hpp"

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <limits>
#include <stdexcept>
#include <vector>

namespace ddprun::worker::qat {

QConfig default_qat_qconfig(const std::string& engine) {
  QConfig q;
  q.weight.dtype = at::kQInt8;
  q.weight.quant_min = -128;
  q.weight.quant_max = 127;
  q.weight.symmetric = true;
  if (engine == "qnnpack") return q;
  if (engine == "fbgemm" || engine == "x86" || engine == "onednn") {
    q.weight.per_channel = true;
    q.weight.ch_axis = 0;
    if (engine != "onednn") {  // fbgemm's and x86's kernels want 7-bit activations
      q.activation.reduce_range = true;
      q.activation.quant_max = 127;
    }
    return q;
  }
  throw std::invalid_argument("no default QAT qconfig for quantized engine '" + engine +
                              "': use qnnpack, fbgemm, x86 or onednn");
}

namespace {

// LibTorch's option variants are c10::variant on 1.x and std::variant on 2.x.
template <class T, class V>
const T* alternative(const V& v) {
  using namespace std;
  using namespace c10;
  return get_if<T>(&v);
}

}  // namespace

ObserverImpl::ObserverImpl(const FakeQuantizeOptions& options) {
  eps = register_buffer("eps", torch::tensor({std::numeric_limits<float>::epsilon()}, torch::kFloat));
  if (options.per_channel) {
    min_val = register_buffer("min_val", torch::empty({0}, torch::kFloat));
    max_val = register_buffer("max_val", torch::empty({0}, torch::kFloat));
  } else {
    min_val = register_buffer("min_val", torch::scalar_tensor(std::numeric_limits<float>::infinity(), torch::kFloat));
    max_val = register_buffer("max_val", torch::scalar_tensor(-std::numeric_limits<float>::infinity(), torch::kFloat));
  }
}

FakeQuantizeImpl::FakeQuantizeImpl(FakeQuantizeOptions options) : options_(options) {
  if (options_.quant_min > options_.quant_max) {
    throw std::invalid_argument("FakeQuantize: quant_min " + std::to_string(options_.quant_min) + " > quant_max " +
                                std::to_string(options_.quant_max));
  }
  fake_quant_enabled = register_buffer("fake_quant_enabled", torch::tensor({int64_t{1}}, torch::kLong));
  observer_enabled = register_buffer("observer_enabled", torch::tensor({int64_t{1}}, torch::kLong));
  scale = register_buffer("scale", torch::tensor({1.0f}, torch::kFloat));
  zero_point = register_buffer("zero_point", torch::tensor({0}, torch::kInt));
  activation_post_process = register_module("activation_post_process", Observer(options_));
}

at::Tensor FakeQuantizeImpl::forward(const at::Tensor& x) {
  return at::fused_moving_avg_obs_fake_quant(
      x, observer_enabled, fake_quant_enabled, activation_post_process->min_val, activation_post_process->max_val,
      scale, zero_point, options_.averaging_constant, options_.quant_min, options_.quant_max,
      options_.per_channel ? options_.ch_axis : -1, options_.per_channel, options_.symmetric);
}

void FakeQuantizeImpl::enable_observer(bool on) { observer_enabled.fill_(on ? 1 : 0); }
void FakeQuantizeImpl::enable_fake_quant(bool on) { fake_quant_enabled.fill_(on ? 1 : 0); }

QuantStubImpl::QuantStubImpl(const QConfig& qconfig) {
  activation_post_process = register_module("activation_post_process", FakeQuantize(qconfig.activation));
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, const QConfig& qconfig, bool bias, bool relu)
    : relu_(relu) {
  // torch::nn::Linear's initialisation (Python's reset_parameters).
  torch::nn::Linear init(torch::nn::LinearOptions(in_features, out_features).bias(bias));
  weight = register_parameter("weight", init->weight.detach());
  if (bias) this->bias = register_parameter("bias", init->bias.detach());
  weight_fake_quant = register_module("weight_fake_quant", FakeQuantize(qconfig.weight));
  activation_post_process = register_module("activation_post_process", FakeQuantize(qconfig.activation));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(x, weight_fake_quant(weight), bias);
  if (relu_) y = torch::relu(y);
  return activation_post_process(y);
}

Conv2dImpl::Conv2dImpl(const torch::nn::Conv2dOptions& options, const QConfig& qconfig, Fused fused)
    : options_(options), fused_(fused) {
  if (!alternative<torch::ExpandingArray<2>>(options.padding())) {
    throw std::invalid_argument("qat::Conv2d takes padding as numbers (not kSame or kValid)");
  }
  if (!alternative<torch::enumtype::kZeros>(options.padding_mode())) {
    throw std::invalid_argument("qat::Conv2d pads with zeros only, as PyTorch's QAT convolutions do");
  }
  torch::nn::Conv2d init(options);  // torch::nn::Conv2d's initialisation
  weight = register_parameter("weight", init->weight.detach());
  if (options.bias()) bias = register_parameter("bias", init->bias.detach());
  if (fused_ != Fused::kNone) bn = register_module("bn", torch::nn::BatchNorm2d(options.out_channels()));
  weight_fake_quant = register_module("weight_fake_quant", FakeQuantize(qconfig.weight));
  activation_post_process = register_module("activation_post_process", FakeQuantize(qconfig.activation));
}

at::Tensor Conv2dImpl::conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  const auto& padding = *alternative<torch::ExpandingArray<2>>(options_.padding());
  return at::conv2d(x, w, b, *options_.stride(), *padding, *options_.dilation(), options_.groups());
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) {
  if (fused_ == Fused::kNone) return activation_post_process(conv(x, weight_fake_quant(weight), bias));
  // BatchNorm folded into the weight with its running statistics; the convolution's output is
  // scaled back and BatchNorm applied to it (conv_fused.py, _forward_approximate).
  const at::Tensor running_std = at::sqrt(bn->running_var + bn->options.eps());
  const at::Tensor scale_factor = bn->weight / running_std;
  std::vector<int64_t> weight_shape(static_cast<size_t>(weight.dim()), 1), bias_shape(weight_shape);
  weight_shape[0] = -1;
  bias_shape[1] = -1;
  const at::Tensor scaled_weight = weight_fake_quant(weight * scale_factor.reshape(weight_shape));
  const at::Tensor zero_bias = bias.defined()
                                   ? at::zeros_like(bias, bias.options().dtype(x.scalar_type()))
                                   : at::zeros({options_.out_channels()}, scaled_weight.options().dtype(x.scalar_type()));
  at::Tensor y = conv(x, scaled_weight, zero_bias) / scale_factor.reshape(bias_shape);
  if (bias.defined()) y = y + bias.reshape(bias_shape);
  y = bn(y);
  if (fused_ == Fused::kBnReLU) y = torch::relu(y);
  return activation_post_process(y);
}

void Conv2dImpl::freeze_bn_stats(bool frozen) {
  if (!bn) return;
  bn_frozen_ = frozen;
  bn->train(!frozen);  // as Python's freeze_bn_stats / update_bn_stats set bn.training
}

void Conv2dImpl::train(bool on) {
  torch::nn::Module::train(on);
  if (bn && bn_frozen_) bn->eval();  // a frozen BatchNorm stays so through model.train()
}

namespace {

template <class F>
void each_module(torch::nn::Module& model, F&& f) {
  f(model);
  for (const auto& m : model.modules(/*include_self=*/false)) f(*m);
}

}  // namespace

void enable_observer(torch::nn::Module& model, bool on) {
  each_module(model, [&](torch::nn::Module& m) {
    if (auto* fq = dynamic_cast<FakeQuantizeImpl*>(&m)) fq->enable_observer(on);
  });
}

void enable_fake_quant(torch::nn::Module& model, bool on) {
  each_module(model, [&](torch::nn::Module& m) {
    if (auto* fq = dynamic_cast<FakeQuantizeImpl*>(&m)) fq->enable_fake_quant(on);
  });
}

void freeze_bn_stats(torch::nn::Module& model, bool frozen) {
  each_module(model, [&](torch::nn::Module& m) {
    if (auto* c = dynamic_cast<Conv2dImpl*>(&m)) c->freeze_bn_stats(frozen);
  });
}

}  // namespace ddprun::worker::qat
