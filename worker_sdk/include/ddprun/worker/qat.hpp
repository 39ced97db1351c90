#pragma once
// Quantization-aware training: the modules of PyTorch's eager-mode QAT (torch.ao.quantization,
// torch.ao.nn.qat, torch.ao.nn.intrinsic.qat) for LibTorch, with Python's arithmetic and
// Python's state-dict names, so that a C++ QAT model and Python's prepare_qat model of the same
// architecture load each other's state dicts and train to the same bits.
//
//   Python                                                  ddprun::worker::qat
//   get_default_qat_qconfig(engine)                         default_qat_qconfig(engine)
//   FusedMovingAvgObsFakeQuantize (+ its observer)          FakeQuantize
//   QuantStub / DeQuantStub (after prepare_qat)             QuantStub / DeQuantStub
//   nn.qat.Linear, nn.intrinsic.qat.LinearReLU              Linear, LinearReLU
//   nn.qat.Conv2d, nn.intrinsic.qat.ConvBn2d, ConvBnReLU2d  Conv2d, ConvBn2d, ConvBnReLU2d
//   (each with the activation_post_process prepare_qat attaches to its output)
//   model.apply(enable_observer / disable_observer)         enable_observer(model, on)
//   model.apply(enable_fake_quant / disable_fake_quant)     enable_fake_quant(model, on)
//   model.apply(freeze_bn_stats / update_bn_stats)          freeze_bn_stats(model, on)
//   torch.backends.quantized.engine = e; convert(model)     convert(model, e)
//
// A model is written with these modules where Python's would be fused and prepared: Python's
//   fuse_modules_qat(m, [["conv", "bn", "relu"]]); prepare_qat(m)
// is, in C++, a member `conv = register_module("conv", qat::ConvBnReLU2d(options, qconfig))` (and
// no bn or relu members: fusing leaves Identity there, which has no state). Under DDP the
// observers' statistics, the quantization parameters and BatchNorm's statistics are buffers and
// follow rank 0, as Python's do.
//
// convert turns the trained model into an int8 one for inference on the CPU, as Python's convert
// swaps each module for its quantized counterpart (nnq.Quantize, nniq.ConvReLU2d, nnq.Conv2d,
// nniq.LinearReLU, nnq.Linear, nnq.DeQuantize): BatchNorm folded into the weights
// (fuse_conv_bn_weights), weights quantized to qint8 with their observers' parameters and
// prepacked for the engine's kernels, outputs requantized with their activation observers'. The
// model's own forward runs unchanged: each module runs its int8 form from then on.
//
// Every module here is a torch::nn::Cloneable, so clone() deep-copies a QAT model as LibTorch's
// modules are copied: parameters, buffers (observer statistics, quantization parameters, the flags
// that turn observers and fake quantization on and off), BatchNorm and its frozen state; a clone
// draws no random numbers. A converted module's clone shares its int8 weights, which nothing writes.

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <memory>
#include <ostream>
#include <string>
#include <utility>

#include "ddprun/worker/serialize.hpp"
#include "ddprun/worker/sync_batch_norm.hpp"

namespace ddprun::worker::qat {

// One FusedMovingAvgObsFakeQuantize: a moving-average min/max observer and the fake quantization
// its statistics give. Set as LibTorch's options are: FakeQuantizeOptions().dtype(at::kQInt8).quant_min(-128).
struct FakeQuantizeOptions {
  TORCH_ARG(at::ScalarType, dtype) = at::kQUInt8;
  // The range in use (reduce_range already applied).
  TORCH_ARG(int64_t, quant_min) = 0;
  TORCH_ARG(int64_t, quant_max) = 255;
  TORCH_ARG(bool, reduce_range) = false;
  TORCH_ARG(bool, per_channel) = false;  // per_channel_symmetric weights: along ch_axis
  TORCH_ARG(int64_t, ch_axis) = 0;
  TORCH_ARG(bool, symmetric) = false;
  TORCH_ARG(double, averaging_constant) = 0.01;
};

struct QConfig {
  FakeQuantizeOptions activation, weight;
};

// What convert does to a module (the modules below implement it).
class Convertible {
 public:
  virtual ~Convertible() = default;
  virtual void convert() = 0;
  // The bytes of its int8 form: quantized weights, float biases, quantization parameters.
  virtual int64_t quantized_bytes() const = 0;
  bool converted() const { return converted_; }

 protected:
  bool converted_ = false;
};

// torch.ao.quantization.get_default_qat_qconfig(engine) for "qnnpack", "fbgemm", "x86" and
// "onednn" (PyTorch 1.13 and 2.6 agree): activations quint8 per tensor (0..127 with reduce_range
// on fbgemm and x86), weights qint8 symmetric, per tensor on qnnpack, per output channel elsewhere.
// std::invalid_argument for another engine.
QConfig default_qat_qconfig(const std::string& engine);

// MovingAverageMinMaxObserver / MovingAveragePerChannelMinMaxObserver: the statistics only (the
// fused operator updates them). min_val and max_val are inf/-inf scalars per tensor, and empty
// per channel until the first batch gives them one value per channel.
class ObserverImpl : public torch::nn::Cloneable<ObserverImpl>, public ResizableBuffers, public PythonStateVersion {
 public:
  explicit ObserverImpl(const FakeQuantizeOptions& options);
  void reset() override;
  int64_t python_state_version() const override { return 3; }  // min_val/max_val, not min_vals/max_vals
  at::Tensor eps, min_val, max_val;

 private:
  bool per_channel_;
};
TORCH_MODULE(Observer);

class FakeQuantizeImpl : public torch::nn::Cloneable<FakeQuantizeImpl>, public ResizableBuffers {
 public:
  explicit FakeQuantizeImpl(FakeQuantizeOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  void enable_observer(bool on);
  void enable_fake_quant(bool on);
  const FakeQuantizeOptions& options() const { return options_; }
  // The observer's quantization parameters from its statistics (Python's calculate_qparams, op
  // for op): scale (float) and zero point, one each per tensor, one per channel per channel.
  std::pair<at::Tensor, at::Tensor> calculate_qparams() const;
  // `w` quantized to the weight dtype with calculate_qparams (Python's _quantize_weight).
  at::Tensor quantize_weight(const at::Tensor& w) const;

  at::Tensor fake_quant_enabled, observer_enabled, scale, zero_point;
  Observer activation_post_process{nullptr};

 private:
  FakeQuantizeOptions options_;
};
TORCH_MODULE(FakeQuantize);

// QuantStub after prepare_qat: fake-quantizes the model's input; converted, quantizes it.
class QuantStubImpl : public torch::nn::Cloneable<QuantStubImpl>, public Convertible {
 public:
  explicit QuantStubImpl(const QConfig& qconfig);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  void convert() override;
  int64_t quantized_bytes() const override { return 16; }
  FakeQuantize activation_post_process{nullptr};

 private:
  FakeQuantizeOptions options_;
  double scale_ = 1;
  int64_t zero_point_ = 0;
};
TORCH_MODULE(QuantStub);

// DeQuantStub: nothing during training; a quantized input it dequantizes.
class DeQuantStubImpl : public torch::nn::Cloneable<DeQuantStubImpl> {
 public:
  void reset() override {}
  at::Tensor forward(const at::Tensor& x) { return x.is_quantized() ? x.dequantize() : x; }
};
TORCH_MODULE(DeQuantStub);

// nn.qat.Linear (relu = false) and nn.intrinsic.qat.LinearReLU, with their output observer. Set
// up as torch::nn::Linear is, from its options: qat::Linear(torch::nn::LinearOptions(84, 10), qconfig),
// and initialised as it is. A LinearReLU holds a LinearImpl (as Python's LinearReLU is a Linear).
class LinearImpl : public torch::nn::Cloneable<LinearImpl>, public Convertible {
 public:
  LinearImpl(const torch::nn::LinearOptions& options, const QConfig& qconfig, bool relu = false);
  // Registers the parameters (uninitialised) and the fake quantizers (clone() calls it).
  void reset() override;
  // torch::nn::Linear's initialisation (Python's reset_parameters): draws from the random generator.
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& x);
  void convert() override;
  int64_t quantized_bytes() const override;
  const torch::nn::LinearOptions& options() const { return options_; }
  at::Tensor weight, bias;
  FakeQuantize weight_fake_quant{nullptr}, activation_post_process{nullptr};

 private:
  torch::nn::LinearOptions options_;
  QConfig qconfig_;
  bool relu_;
  at::Tensor qweight_;  // converted: the int8 weight, packed_ its engine's form
  c10::IValue packed_;
  double scale_ = 1;
  int64_t zero_point_ = 0;
};
TORCH_MODULE(Linear);

class LinearReLU : public torch::nn::ModuleHolder<LinearImpl> {
 public:
  // Implicit, as TORCH_MODULE's are: `fc = register_module("fc", LinearReLU(...))`, `LinearReLU fc{nullptr}`.
  LinearReLU(std::nullptr_t) : ModuleHolder(nullptr) {}                            // NOLINT
  LinearReLU(std::shared_ptr<LinearImpl> impl) : ModuleHolder(std::move(impl)) {}  // NOLINT
  LinearReLU(const torch::nn::LinearOptions& options, const QConfig& qconfig)
      : ModuleHolder(std::make_shared<LinearImpl>(options, qconfig, /*relu=*/true)) {}
};

// nn.qat.Conv2d (zeros padding), and the fused Conv2d + BatchNorm2d (+ ReLU) of
// nn.intrinsic.qat.ConvBn2d / ConvBnReLU2d: BatchNorm folded into the weight before it is
// fake-quantized, as conv_fused.py's _forward_approximate does; freeze_bn_stats stops BatchNorm's
// statistics (BatchNorm then runs as in eval) until update_bn_stats. With with_sync_bn the BatchNorm is
// a SyncBatchNorm (Python's convert_sync_batchnorm of the prepared model: the same state-dict
// names), whose group set_sync_batch_norm_group gives. Initialised as torch::nn::Conv2d is. A
// ConvBn2d and a ConvBnReLU2d hold a Conv2dImpl with its fusion.
class Conv2dImpl : public torch::nn::Cloneable<Conv2dImpl>, public PythonStateVersion, public Convertible {
 public:
  enum class Fused { kNone, kBn, kBnReLU };
  Conv2dImpl(const torch::nn::Conv2dOptions& options, const QConfig& qconfig, Fused fused = Fused::kNone,
             bool with_sync_bn = false);
  // Registers the parameters (uninitialised), BatchNorm and the fake quantizers (clone() calls it).
  void reset() override;
  // torch::nn::Conv2d's initialisation: draws from the random generator.
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& x);
  void freeze_bn_stats(bool frozen = true);
  void train(bool on = true) override;
  int64_t python_state_version() const override { return fused_ == Fused::kNone ? 1 : 2; }  // _ConvBnNd: 2
  void convert() override;
  int64_t quantized_bytes() const override;

  at::Tensor weight, bias;
  torch::nn::BatchNorm2d bn{nullptr};  // kBn, kBnReLU: one of the two, registered as "bn"
  SyncBatchNorm sync_bn{nullptr};
  FakeQuantize weight_fake_quant{nullptr}, activation_post_process{nullptr};

 private:
  at::Tensor conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  struct BatchNormParts {
    at::Tensor weight, bias, running_mean, running_var;
    double eps;
  };
  BatchNormParts bn_parts() const;
  torch::nn::Module* bn_module() const;
  torch::nn::Conv2dOptions options_;
  QConfig qconfig_;
  Fused fused_;
  bool with_sync_bn_;
  bool bn_frozen_ = false;
  at::Tensor qweight_, qbias_;  // converted
  c10::IValue packed_;
  double scale_ = 1;
  int64_t zero_point_ = 0;
};
TORCH_MODULE(Conv2d);

class ConvBn2d : public torch::nn::ModuleHolder<Conv2dImpl> {
 public:
  // Implicit, as TORCH_MODULE's are: `fc = register_module("fc", ConvBn2d(...))`, `ConvBn2d fc{nullptr}`.
  ConvBn2d(std::nullptr_t) : ModuleHolder(nullptr) {}                            // NOLINT
  ConvBn2d(std::shared_ptr<Conv2dImpl> impl) : ModuleHolder(std::move(impl)) {}  // NOLINT
  ConvBn2d(const torch::nn::Conv2dOptions& options, const QConfig& qconfig, bool with_sync_bn = false)
      : ModuleHolder(std::make_shared<Conv2dImpl>(options, qconfig, Conv2dImpl::Fused::kBn, with_sync_bn)) {}
};

class ConvBnReLU2d : public torch::nn::ModuleHolder<Conv2dImpl> {
 public:
  // Implicit, as TORCH_MODULE's are: `fc = register_module("fc", ConvBnReLU2d(...))`, `ConvBnReLU2d fc{nullptr}`.
  ConvBnReLU2d(std::nullptr_t) : ModuleHolder(nullptr) {}                            // NOLINT
  ConvBnReLU2d(std::shared_ptr<Conv2dImpl> impl) : ModuleHolder(std::move(impl)) {}  // NOLINT
  ConvBnReLU2d(const torch::nn::Conv2dOptions& options, const QConfig& qconfig, bool with_sync_bn = false)
      : ModuleHolder(std::make_shared<Conv2dImpl>(options, qconfig, Conv2dImpl::Fused::kBnReLU, with_sync_bn)) {}
};

// tq.QuantWrapper: the model between a QuantStub and a DeQuantStub.
class QuantWrapperImpl : public torch::nn::Cloneable<QuantWrapperImpl> {
 public:
  QuantWrapperImpl(torch::nn::Sequential module, const QConfig& qconfig);
  void reset() override;
  at::Tensor forward(const at::Tensor& x) { return dequant(module->forward(quant(x))); }
  QuantStub quant{nullptr};
  DeQuantStub dequant{nullptr};
  torch::nn::Sequential module{nullptr};

 private:
  QConfig qconfig_;
};
TORCH_MODULE(QuantWrapper);

// Python's prepare_qat(QuantWrapper(fuse_modules_qat(copy_of_model, fuse))) for a Sequential:
// each group of `fuse` (entries' indices, as Python names a Sequential's children) becomes one
// fused module at its first entry and Identity at the others (Python's names and state: "module.1"
// holds nothing) — Conv2d + BatchNorm2d + ReLU a ConvBnReLU2d, Conv2d + BatchNorm2d a ConvBn2d,
// Linear + ReLU a LinearReLU; every other Conv2d and Linear its QAT module; the float weights and
// BatchNorm's parameters, statistics and options carried over, everything else cloned. `model` is
// left as it was. std::invalid_argument names a group that is not one of those patterns.
QuantWrapper prepare_qat(const torch::nn::Sequential& model, const QConfig& qconfig,
                         const std::vector<std::vector<size_t>>& fuse);

// Over every FakeQuantize in `model`: observers on or off (off: the quantization parameters stay
// as they are), fake quantization on or off (off: the float values pass).
void enable_observer(torch::nn::Module& model, bool on = true);
void enable_fake_quant(torch::nn::Module& model, bool on = true);
// Over every fused Conv + BatchNorm in `model`: BatchNorm's statistics frozen (true) or updated again.
void freeze_bn_stats(torch::nn::Module& model, bool frozen = true);

// Sets LibTorch's quantized engine ("qnnpack", "onednn", "fbgemm", "x86"; this build's are in
// std::invalid_argument's message otherwise) and converts every QAT module of `model`. The int8
// kernels are CPU kernels: a model trained on a GPU is moved to the CPU first (its inputs then
// belong there too).
void convert(torch::nn::Module& model, const std::string& engine);
// The bytes of the converted model's int8 form (its modules' quantized_bytes).
int64_t quantized_bytes(torch::nn::Module& model);

}  // namespace ddprun::worker::qat
