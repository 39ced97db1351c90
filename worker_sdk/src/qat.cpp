// Quantization-aware training modules (see qat.hpp). Every forward is the operation sequence of
// PyTorch's Python modules, so the two agree to the bit on the same weights and data:
// torch/ao/quantization/fake_quantize.py (FusedMovingAvgObsFakeQuantize.forward),
// torch/ao/nn/qat/modules/{linear,conv}.py, torch/ao/nn/intrinsic/qat/modules/{linear_relu,conv_fused}.py.
#include "ddprun/worker/qat.hpp"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <ios>
#include <limits>
#include <map>
#include <stdexcept>
#include <vector>

namespace ddprun::worker::qat {

QConfig default_qat_qconfig(const std::string& engine) {
  QConfig q;
  q.weight.dtype(at::kQInt8);
  q.weight.quant_min(-128);
  q.weight.quant_max(127);
  q.weight.symmetric(true);
  if (engine == "qnnpack") return q;
  if (engine == "fbgemm" || engine == "x86" || engine == "onednn") {
    q.weight.per_channel(true);
    q.weight.ch_axis(0);
    if (engine != "onednn") {  // fbgemm's and x86's kernels want 7-bit activations
      q.activation.reduce_range(true);
      q.activation.quant_max(127);
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

// Calls a quantized operator by its schema (quantized::linear...: their packed weights are
// TorchScript classes, which the boxed call carries as IValues).
c10::IValue call_op(const char* name, const char* overload, std::vector<c10::IValue> args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  std::vector<c10::IValue> stack = std::move(args);
  op.callBoxed(&stack);
  return std::move(stack.front());
}

c10::IValue ints(const torch::ExpandingArray<2>& a) { return std::vector<int64_t>(a->begin(), a->end()); }

int64_t qparams_bytes(const at::Tensor& scale) { return scale.numel() * 16; }  // a double and an int64 each

void copy_into(const at::Tensor& to, const at::Tensor& from) {
  torch::NoGradGuard no_grad;
  to.copy_(from);
}

}  // namespace

ObserverImpl::ObserverImpl(const FakeQuantizeOptions& options) : per_channel_(options.per_channel()) { reset(); }

void ObserverImpl::reset() {
  eps = register_buffer("eps", torch::tensor({std::numeric_limits<float>::epsilon()}, torch::kFloat));
  if (per_channel_) {
    min_val = register_buffer("min_val", torch::empty({0}, torch::kFloat));
    max_val = register_buffer("max_val", torch::empty({0}, torch::kFloat));
  } else {
    min_val = register_buffer("min_val", torch::scalar_tensor(std::numeric_limits<float>::infinity(), torch::kFloat));
    max_val = register_buffer("max_val", torch::scalar_tensor(-std::numeric_limits<float>::infinity(), torch::kFloat));
  }
}

FakeQuantizeImpl::FakeQuantizeImpl(FakeQuantizeOptions options) : options_(options) {
  if (options_.quant_min() > options_.quant_max()) {
    throw std::invalid_argument("FakeQuantize: quant_min " + std::to_string(options_.quant_min()) + " > quant_max " +
                                std::to_string(options_.quant_max()));
  }
  reset();
}

void FakeQuantizeImpl::reset() {
  fake_quant_enabled = register_buffer("fake_quant_enabled", torch::tensor({int64_t{1}}, torch::kLong));
  observer_enabled = register_buffer("observer_enabled", torch::tensor({int64_t{1}}, torch::kLong));
  scale = register_buffer("scale", torch::tensor({1.0f}, torch::kFloat));
  zero_point = register_buffer("zero_point", torch::tensor({0}, torch::kInt));
  activation_post_process = register_module("activation_post_process", Observer(options_));
}

at::Tensor FakeQuantizeImpl::forward(const at::Tensor& x) {
  return at::fused_moving_avg_obs_fake_quant(
      x, observer_enabled, fake_quant_enabled, activation_post_process->min_val, activation_post_process->max_val,
      scale, zero_point, options_.averaging_constant(), options_.quant_min(), options_.quant_max(),
      options_.per_channel() ? options_.ch_axis() : -1, options_.per_channel(), options_.symmetric());
}

std::pair<at::Tensor, at::Tensor> FakeQuantizeImpl::calculate_qparams() const {
  // torch/ao/quantization/observer.py: _calculate_qparams (and check_min_max_valid), op for op.
  const at::Tensor& min_val = activation_post_process->min_val;
  const at::Tensor& max_val = activation_post_process->max_val;
  auto defaults = [] { return std::make_pair(at::tensor({1.0f}), at::tensor({int64_t{0}})); };
  if (min_val.numel() == 0 || max_val.numel() == 0) return defaults();  // never observed
  if (min_val.dim() == 0 || max_val.dim() == 0) {
    if (min_val.item<float>() == std::numeric_limits<float>::infinity() &&
        max_val.item<float>() == -std::numeric_limits<float>::infinity()) {
      return defaults();
    }
  }
  if (!at::all(min_val <= max_val).item<bool>()) {
    throw std::runtime_error("FakeQuantize: an observer's min_val exceeds its max_val");
  }
  const int64_t qmin = options_.quant_min(), qmax = options_.quant_max();
  const at::Tensor min_val_neg = at::min(min_val, at::zeros_like(min_val));
  at::Tensor max_val_pos = at::max(max_val, at::zeros_like(max_val));
  at::Tensor q_scale = at::ones(min_val_neg.sizes(), at::kFloat);
  at::Tensor q_zero_point = at::zeros(min_val_neg.sizes(), at::kLong);
  const at::Tensor& eps = activation_post_process->eps;
  if (options_.symmetric()) {
    max_val_pos = at::max(-min_val_neg, max_val_pos);
    q_scale = max_val_pos / (static_cast<double>(qmax - qmin) / 2);
    q_scale = at::max(q_scale, eps);
    if (options_.dtype() == at::kQUInt8) q_zero_point = at::full(q_zero_point.sizes(), (qmin + qmax) / 2, at::kLong);
  } else {
    q_scale = (max_val_pos - min_val_neg) / static_cast<double>(qmax - qmin);
    q_scale = at::max(q_scale, eps);
    q_zero_point = at::rsub(at::round(min_val_neg / q_scale).to(at::kInt), qmin);
    q_zero_point = at::clamp(q_zero_point, qmin, qmax);
  }
  if (q_scale.dim() == 0) q_scale = at::tensor({q_scale.item<float>()}, at::kFloat);
  if (q_zero_point.dim() == 0) q_zero_point = at::tensor({q_zero_point.item<int64_t>()}, q_zero_point.scalar_type());
  return {q_scale, q_zero_point};
}

at::Tensor FakeQuantizeImpl::quantize_weight(const at::Tensor& w) const {
  const auto [q_scale, q_zero_point] = calculate_qparams();
  if (options_.per_channel()) {
    return at::quantize_per_channel(w, q_scale.to(at::kDouble), q_zero_point.to(at::kLong), options_.ch_axis(),
                                    options_.dtype());
  }
  return at::quantize_per_tensor(w, q_scale.item<double>(), q_zero_point.item<int64_t>(), options_.dtype());
}

void FakeQuantizeImpl::enable_observer(bool on) { observer_enabled.fill_(on ? 1 : 0); }
void FakeQuantizeImpl::enable_fake_quant(bool on) { fake_quant_enabled.fill_(on ? 1 : 0); }

QuantStubImpl::QuantStubImpl(const QConfig& qconfig) : options_(qconfig.activation) { reset(); }

void QuantStubImpl::reset() {
  activation_post_process = register_module("activation_post_process", FakeQuantize(options_));
}

at::Tensor QuantStubImpl::forward(const at::Tensor& x) {
  if (converted_) return at::quantize_per_tensor(x, scale_, zero_point_, activation_post_process->options().dtype());
  return activation_post_process(x);
}

void QuantStubImpl::convert() {
  const auto [scale, zero_point] = activation_post_process->calculate_qparams();
  scale_ = scale.to(at::kFloat).item<double>();
  zero_point_ = zero_point.to(at::kLong).item<int64_t>();
  converted_ = true;
}

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options, const QConfig& qconfig, bool relu)
    : options_(options), qconfig_(qconfig), relu_(relu) {
  reset();
  reset_parameters();
}

void LinearImpl::reset() {
  weight = register_parameter("weight", torch::empty({options_.out_features(), options_.in_features()}));
  if (options_.bias()) bias = register_parameter("bias", torch::empty({options_.out_features()}));
  weight_fake_quant = register_module("weight_fake_quant", FakeQuantize(qconfig_.weight));
  activation_post_process = register_module("activation_post_process", FakeQuantize(qconfig_.activation));
}

void LinearImpl::reset_parameters() {
  const torch::nn::Linear init(options_);
  copy_into(weight, init->weight);
  if (options_.bias()) copy_into(bias, init->bias);
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "ddprun::worker::qat::" << (relu_ ? "LinearReLU" : "Linear") << "(in_features=" << options_.in_features()
         << ", out_features=" << options_.out_features() << ", bias=" << std::boolalpha << options_.bias() << ")";
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  if (converted_) {
    return call_op(relu_ ? "quantized::linear_relu" : "quantized::linear", "", {x, packed_, scale_, zero_point_})
        .toTensor();
  }
  at::Tensor y = at::linear(x, weight_fake_quant(weight), bias);
  if (relu_) y = torch::relu(y);
  return activation_post_process(y);
}

void LinearImpl::convert() {
  torch::NoGradGuard no_grad;
  const auto [scale, zero_point] = activation_post_process->calculate_qparams();
  weight_fake_quant(weight);  // as Python's from_float runs the weight's fake quantizer once more
  qweight_ = weight_fake_quant->quantize_weight(weight.to(at::kFloat));
  packed_ = call_op("quantized::linear_prepack", "", {qweight_, bias.defined() ? c10::IValue(bias) : c10::IValue()});
  scale_ = scale.item<double>();
  zero_point_ = zero_point.item<int64_t>();
  converted_ = true;
}

int64_t LinearImpl::quantized_bytes() const {
  return qweight_.numel() + (bias.defined() ? bias.numel() * 4 : 0) +
         qparams_bytes(weight_fake_quant->calculate_qparams().first) + 16;
}

Conv2dImpl::Conv2dImpl(const torch::nn::Conv2dOptions& options, const QConfig& qconfig, Fused fused, bool with_sync_bn)
    : options_(options), qconfig_(qconfig), fused_(fused), with_sync_bn_(with_sync_bn) {
  if (!alternative<torch::ExpandingArray<2>>(options.padding())) {
    throw std::invalid_argument("qat::Conv2d takes padding as numbers (not kSame or kValid)");
  }
  if (!alternative<torch::enumtype::kZeros>(options.padding_mode())) {
    throw std::invalid_argument("qat::Conv2d pads with zeros only, as PyTorch's QAT convolutions do");
  }
  reset();
  reset_parameters();
}

void Conv2dImpl::reset() {
  std::vector<int64_t> shape{options_.out_channels(), options_.in_channels() / options_.groups()};
  shape.insert(shape.end(), options_.kernel_size()->begin(), options_.kernel_size()->end());
  weight = register_parameter("weight", torch::empty(shape));
  if (options_.bias()) bias = register_parameter("bias", torch::empty({options_.out_channels()}));
  if (fused_ != Fused::kNone && with_sync_bn_) {
    sync_bn = register_module("bn", SyncBatchNorm(options_.out_channels()));
  } else if (fused_ != Fused::kNone) {
    bn = register_module("bn", torch::nn::BatchNorm2d(options_.out_channels()));
  }
  weight_fake_quant = register_module("weight_fake_quant", FakeQuantize(qconfig_.weight));
  activation_post_process = register_module("activation_post_process", FakeQuantize(qconfig_.activation));
}

void Conv2dImpl::reset_parameters() {
  const torch::nn::Conv2d init(options_);
  copy_into(weight, init->weight);
  if (options_.bias()) copy_into(bias, init->bias);
}

void Conv2dImpl::pretty_print(std::ostream& stream) const {
  static constexpr const char* kNames[] = {"Conv2d", "ConvBn2d", "ConvBnReLU2d"};
  stream << "ddprun::worker::qat::" << kNames[static_cast<int>(fused_)] << "(" << options_.in_channels() << ", "
         << options_.out_channels() << ", kernel_size=" << options_.kernel_size() << ", stride=" << options_.stride()
         << ")";
}

at::Tensor Conv2dImpl::conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  const auto& padding = *alternative<torch::ExpandingArray<2>>(options_.padding());
  return at::conv2d(x, w, b, *options_.stride(), *padding, *options_.dilation(), options_.groups());
}

Conv2dImpl::BatchNormParts Conv2dImpl::bn_parts() const {
  if (sync_bn)
    return {sync_bn->weight, sync_bn->bias, sync_bn->running_mean, sync_bn->running_var, sync_bn->options.eps()};
  return {bn->weight, bn->bias, bn->running_mean, bn->running_var, bn->options.eps()};
}

torch::nn::Module* Conv2dImpl::bn_module() const {
  if (sync_bn) return sync_bn.ptr().get();
  return bn ? bn.ptr().get() : nullptr;
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) {
  if (converted_) {
    return call_op(fused_ == Fused::kBnReLU ? "quantized::conv2d_relu" : "quantized::conv2d", "new",
                   {x, packed_, scale_, zero_point_})
        .toTensor();
  }
  if (fused_ == Fused::kNone) return activation_post_process(conv(x, weight_fake_quant(weight), bias));
  // BatchNorm folded into the weight with its running statistics; the convolution's output is
  // scaled back and BatchNorm applied to it (conv_fused.py, _forward_approximate).
  const BatchNormParts p = bn_parts();
  const at::Tensor running_std = at::sqrt(p.running_var + p.eps);
  const at::Tensor scale_factor = p.weight / running_std;
  std::vector<int64_t> weight_shape(static_cast<size_t>(weight.dim()), 1), bias_shape(weight_shape);
  weight_shape[0] = -1;
  bias_shape[1] = -1;
  const at::Tensor scaled_weight = weight_fake_quant(weight * scale_factor.reshape(weight_shape));
  const at::Tensor zero_bias =
      bias.defined() ? at::zeros_like(bias, bias.options().dtype(x.scalar_type()))
                     : at::zeros({options_.out_channels()}, scaled_weight.options().dtype(x.scalar_type()));
  at::Tensor y = conv(x, scaled_weight, zero_bias) / scale_factor.reshape(bias_shape);
  if (bias.defined()) y = y + bias.reshape(bias_shape);
  y = sync_bn ? sync_bn(y) : bn(y);
  if (fused_ == Fused::kBnReLU) y = torch::relu(y);
  return activation_post_process(y);
}

void Conv2dImpl::convert() {
  torch::NoGradGuard no_grad;
  at::Tensor w = weight, b = bias;
  if (bn_module()) {
    // torch/nn/utils/fusion.py, fuse_conv_bn_weights: BatchNorm's statistics and affine folded in.
    const BatchNormParts p = bn_parts();
    const at::Tensor conv_b = b.defined() ? b : at::zeros_like(p.running_mean);
    const at::Tensor bn_var_rsqrt = at::rsqrt(p.running_var + p.eps);
    std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
    shape[0] = -1;
    w = (w * (p.weight * bn_var_rsqrt).reshape(shape)).to(weight.scalar_type());
    b = ((conv_b - p.running_mean) * bn_var_rsqrt * p.weight + p.bias).to(conv_b.scalar_type());
  }
  weight_fake_quant(w);  // as Python's get_qconv runs the weight's fake quantizer once more
  qweight_ = weight_fake_quant->quantize_weight(w.to(at::kFloat));
  qbias_ = b;
  const auto& padding = *alternative<torch::ExpandingArray<2>>(options_.padding());
  packed_ = call_op("quantized::conv2d_prepack", "",
                    {qweight_, b.defined() ? c10::IValue(b) : c10::IValue(), ints(options_.stride()), ints(padding),
                     ints(options_.dilation()), options_.groups()});
  const auto [scale, zero_point] = activation_post_process->calculate_qparams();
  scale_ = scale.item<double>();
  zero_point_ = zero_point.item<int64_t>();
  converted_ = true;
}

int64_t Conv2dImpl::quantized_bytes() const {
  return qweight_.numel() + (qbias_.defined() ? qbias_.numel() * 4 : 0) +
         qparams_bytes(weight_fake_quant->calculate_qparams().first) + 16;
}

void Conv2dImpl::freeze_bn_stats(bool frozen) {
  torch::nn::Module* m = bn_module();
  if (!m) return;
  bn_frozen_ = frozen;
  m->train(!frozen);  // as Python's freeze_bn_stats / update_bn_stats set bn.training
}

void Conv2dImpl::train(bool on) {
  torch::nn::Module::train(on);
  if (bn_frozen_ && bn_module()) bn_module()->eval();  // a frozen BatchNorm stays so through model.train()
}

namespace {

// Calls f on each module of the model, the model included, that is an M.
template <class M, class F>
void each_module(torch::nn::Module& model, F&& f) {
  if (auto* m = dynamic_cast<M*>(&model)) f(*m);
  for (const auto& child : model.modules(/*include_self=*/false)) {
    if (auto* m = dynamic_cast<M*>(child.get())) f(*m);
  }
}

}  // namespace

void enable_observer(torch::nn::Module& model, bool on) {
  each_module<FakeQuantizeImpl>(model, [&](FakeQuantizeImpl& fq) { fq.enable_observer(on); });
}

void enable_fake_quant(torch::nn::Module& model, bool on) {
  each_module<FakeQuantizeImpl>(model, [&](FakeQuantizeImpl& fq) { fq.enable_fake_quant(on); });
}

void freeze_bn_stats(torch::nn::Module& model, bool frozen) {
  each_module<Conv2dImpl>(model, [&](Conv2dImpl& c) { c.freeze_bn_stats(frozen); });
}

QuantWrapperImpl::QuantWrapperImpl(torch::nn::Sequential m, const QConfig& qconfig) : qconfig_(qconfig) {
  reset();
  module = replace_module("module", std::move(m));
}

void QuantWrapperImpl::reset() {
  quant = register_module("quant", QuantStub(qconfig_));
  dequant = register_module("dequant", DeQuantStub());
  module = register_module("module", torch::nn::Sequential());  // the wrapped model, or its clone, goes here
}

namespace {

// A QAT convolution with the float one's options and weights (and BatchNorm's, when fused).
Conv2d qat_conv(const torch::nn::Conv2dImpl& conv, const QConfig& qconfig, Conv2dImpl::Fused fused,
                const torch::nn::BatchNorm2dImpl* bn) {
  const auto& c = conv.options;
  torch::nn::Conv2dOptions options(c.in_channels(), c.out_channels(), c.kernel_size());
  options.stride(c.stride()).padding(c.padding()).dilation(c.dilation()).groups(c.groups()).bias(c.bias());
  options.padding_mode(c.padding_mode());
  Conv2d q(options, qconfig, fused);
  copy_into(q->weight, conv.weight);
  if (conv.options.bias()) copy_into(q->bias, conv.bias);
  if (bn) {
    auto copy = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(bn->clone());
    q->bn = q->replace_module("bn", torch::nn::BatchNorm2d(copy));
  }
  return q;
}

Linear qat_linear(const torch::nn::LinearImpl& linear, const QConfig& qconfig, bool relu) {
  Linear q(linear.options, qconfig, relu);
  copy_into(q->weight, linear.weight);
  if (linear.options.bias()) copy_into(q->bias, linear.bias);
  return q;
}

}  // namespace

QuantWrapper prepare_qat(const torch::nn::Sequential& model, const QConfig& qconfig,
                         const std::vector<std::vector<size_t>>& fuse) {
  const size_t n = model->size();
  std::vector<const std::vector<size_t>*> group_at(n, nullptr);
  std::vector<bool> fused_away(n, false);
  for (const auto& g : fuse) {
    if (g.empty()) continue;
    for (size_t k = 0; k < g.size(); ++k) {
      if (g[k] >= n || group_at[g[k]] || fused_away[g[k]]) {
        throw std::invalid_argument("prepare_qat: fuse group entry " + std::to_string(g[k]) +
                                    " is past the Sequential's " + std::to_string(n) + " entries or in two groups");
      }
      if (k == 0) {
        group_at[g[k]] = &g;  // the group's module goes where its first entry was
      } else {
        fused_away[g[k]] = true;
      }
    }
  }
  auto is = [&](size_t i, auto* type) {
    return dynamic_cast<std::remove_pointer_t<decltype(type)>*>(model->ptr(i).get()) != nullptr;
  };
  torch::nn::Sequential out;
  size_t i = 0;
  for (const auto& entry : *model) {
    const std::string name = std::to_string(i);
    if (fused_away[i]) {
      out->push_back(std::string(name), torch::nn::Identity());
    } else if (const auto* g = group_at[i]) {
      const auto& idx = *g;
      auto* conv = dynamic_cast<torch::nn::Conv2dImpl*>(model->ptr(idx[0]).get());
      auto* linear = dynamic_cast<torch::nn::LinearImpl*>(model->ptr(idx[0]).get());
      auto* bn = idx.size() > 1 ? dynamic_cast<torch::nn::BatchNorm2dImpl*>(model->ptr(idx[1]).get()) : nullptr;
      const bool relu_last = idx.size() > 1 && is(idx.back(), static_cast<torch::nn::ReLUImpl*>(nullptr));
      if (conv && bn && idx.size() == 3 && relu_last) {
        out->push_back(std::string(name), qat_conv(*conv, qconfig, Conv2dImpl::Fused::kBnReLU, bn));
      } else if (conv && bn && idx.size() == 2) {
        out->push_back(std::string(name), qat_conv(*conv, qconfig, Conv2dImpl::Fused::kBn, bn));
      } else if (linear && idx.size() == 2 && relu_last) {
        out->push_back(std::string(name), qat_linear(*linear, qconfig, /*relu=*/true));
      } else {
        std::string types;
        for (size_t k : idx) types += (types.empty() ? "" : ", ") + model->ptr(k)->name();
        throw std::invalid_argument("prepare_qat: cannot fuse (" + types +
                                    "): the groups are Conv2d, BatchNorm2d, ReLU; Conv2d, BatchNorm2d; Linear, ReLU");
      }
    } else if (auto* conv = dynamic_cast<torch::nn::Conv2dImpl*>(model->ptr(i).get())) {
      out->push_back(std::string(name), qat_conv(*conv, qconfig, Conv2dImpl::Fused::kNone, nullptr));
    } else if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(model->ptr(i).get())) {
      out->push_back(std::string(name), qat_linear(*linear, qconfig, /*relu=*/false));
    } else {
      out->push_back(std::string(name), entry.clone());
    }
    ++i;
  }
  QuantWrapper wrapper(out, qconfig);
  wrapper->train(model->is_training());
  return wrapper;
}

void convert(torch::nn::Module& model, const std::string& engine) {
  static const std::map<std::string, at::QEngine> engines{{"qnnpack", at::QEngine::QNNPACK},
                                                          {"onednn", at::QEngine::ONEDNN},
                                                          {"fbgemm", at::QEngine::FBGEMM},
                                                          {"x86", at::QEngine::X86}};
  const auto& supported = at::globalContext().supportedQEngines();
  auto here = [&](at::QEngine e) { return std::find(supported.begin(), supported.end(), e) != supported.end(); };
  const auto it = engines.find(engine);
  if (it == engines.end() || !here(it->second)) {
    std::string names;
    for (const auto& [name, e] : engines) names += here(e) ? (names.empty() ? "" : ", ") + name : "";
    throw std::invalid_argument("quantized engine '" + engine + "' is not in this LibTorch; it has: " + names);
  }
  at::globalContext().setQEngine(it->second);
  model.to(torch::kCPU);
  each_module<Convertible>(model, [](Convertible& c) { c.convert(); });
}

int64_t quantized_bytes(torch::nn::Module& model) {
  int64_t bytes = 0;
  each_module<Convertible>(model, [&](Convertible& c) { bytes += c.converted() ? c.quantized_bytes() : 0; });
  return bytes;
}

}  // namespace ddprun::worker::qat
