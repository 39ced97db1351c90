// The quantization-aware training modes of sdk_test_worker (qat-parity, qat-sequential, qat-sync-bn,
// qat-clone).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "sdk_test_worker.hpp"

namespace ddprun::test::sdk_worker {
namespace {

// tests/python/test_worker_sdk_interop.py's QatNet after fuse_modules_qat and prepare_qat.
struct QatNetImpl : torch::nn::Module {
  explicit QatNetImpl(const qat::QConfig& q) {
    using torch::nn::Conv2dOptions;
    quant = register_module("quant", qat::QuantStub(q));
    conv = register_module("conv", qat::ConvBnReLU2d(Conv2dOptions(1, 4, 3).padding(1), q));
    conv2 = register_module("conv2", qat::ConvBn2d(Conv2dOptions(4, 6, 3), q));
    conv3 = register_module("conv3", qat::Conv2d(Conv2dOptions(6, 6, 1), q));
    fc1 = register_module("fc1", qat::LinearReLU(torch::nn::LinearOptions(6 * 2 * 2, 16), q));
    fc2 = register_module("fc2", qat::Linear(torch::nn::LinearOptions(16, 5), q));
    dequant = register_module("dequant", qat::DeQuantStub());
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(conv(quant(x)), {2, 2}, {}, {0, 0}, {1, 1});  // the quantized kernel takes no shorthand
    x = conv3(conv2(x));
    return dequant(fc2(fc1(x.flatten(1))));
  }
  qat::QuantStub quant{nullptr};
  qat::ConvBnReLU2d conv{nullptr};
  qat::ConvBn2d conv2{nullptr};
  qat::Conv2d conv3{nullptr};
  qat::LinearReLU fc1{nullptr};
  qat::Linear fc2{nullptr};
  qat::DeQuantStub dequant{nullptr};
};
TORCH_MODULE(QatNet);

// Trains a QAT model on the schedule given (observers off from step OBSERVER_OFF, BatchNorm
// statistics frozen from FREEZE_BN), under DDP; saves the losses, the final state dict and an
// evaluation's output into `result` for the Python side to compare, then (`convert`) converts the
// model to int8 on the engine and adds its output on the same batch.
template <class Impl>
int train_qat(Distributed& dist, std::shared_ptr<Impl> model, const std::string& engine, const std::string& out,
              int steps, int observer_off, int freeze_bn, bool convert, c10::impl::GenericDict result) {
  const auto device = interop_device(dist);
  model->to(device);
  DistributedDataParallel<Impl> ddp(model, dist);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  c10::impl::GenericList losses(c10::AnyType::get());
  for (int step = 0; step < steps; ++step) {
    if (step == observer_off) qat::enable_observer(*model, false);
    if (step == freeze_bn) qat::freeze_bn_stats(*model);
    auto [x, y] = global_batch(step, 1, 4);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(ddp(x.to(device)), y.to(device));
    loss.backward();
    opt.step();
    losses.push_back(loss.template item<double>());
  }
  model->eval();
  auto [x, y] = global_batch(100, 1, 4);
  torch::NoGradGuard no_grad;
  const torch::Tensor eval_out = model->forward(x.to(device));
  if (dist.is_main()) {
    result.insert("model", state_dict(*model));
    result.insert("losses", losses);
    result.insert("eval_out", eval_out);
    if (convert) {
      qat::convert(*model, engine);  // (onto the CPU, where the int8 kernels are)
      result.insert("int8_out", model->forward(x));
      result.insert("quantized_bytes", qat::quantized_bytes(*model));
    }
    torch_save(result, out);
  }
  return 0;
}

}  // namespace

// The QAT model from Python's prepared state dict.
int qat_parity(const std::string& engine, const std::string& in, const std::string& out, int steps, int observer_off,
               int freeze_bn, bool convert) {
  auto dist = interop_init();
  QatNet model(qat::default_qat_qconfig(engine));
  load_state_dict(*model, torch_load(in));
  return train_qat(dist, model.ptr(), engine, out, steps, observer_off, freeze_bn, convert,
                   c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

// A float Sequential from Python's float state dict, prepared by qat::prepare_qat with fusion:
// the prepared state dict (before training) goes into the result beside the training's.
int qat_prepare_sequential(const std::string& engine, const std::string& in, const std::string& out, int steps,
                           int observer_off, int freeze_bn) {
  using namespace torch::nn;
  auto dist = interop_init();
  Sequential seq(Conv2d(Conv2dOptions(1, 4, 3).padding(1)), BatchNorm2d(4), ReLU(), MaxPool2d(MaxPool2dOptions(2)),
                 Conv2d(4, 6, 3), BatchNorm2d(6), Conv2d(6, 6, 1), Flatten(), torch::nn::Linear(24, 16), ReLU(),
                 torch::nn::Linear(16, 5));
  load_state_dict(*seq, torch_load(in));
  auto model = qat::prepare_qat(seq, qat::default_qat_qconfig(engine), {{0, 1, 2}, {4, 5}, {8, 9}});
  c10::impl::GenericDict result(c10::StringType::get(), c10::AnyType::get());
  result.insert("prepared", torch_load_bytes(torch_save_bytes(state_dict(*model))));  // a copy, as it was
  return train_qat(dist, model.ptr(), engine, out, steps, observer_off, freeze_bn, false, result);
}

// A ConvBnReLU2d whose BatchNorm is a SyncBatchNorm, on each rank's share of a batch, against the
// plain module on the whole batch in one process: the same BatchNorm statistics and the same
// output (the activations' fake quantization off: each rank's observer sees its own share).
int qat_sync_bn() {
  auto dist = Distributed::init();
  const int world = dist.world_size(), rank = dist.rank(), per_rank = 3;
  const auto q = qat::default_qat_qconfig("qnnpack");
  const auto options = torch::nn::Conv2dOptions(2, 4, 3).padding(1);
  torch::manual_seed(5);
  qat::ConvBnReLU2d whole(options, q);
  qat::ConvBnReLU2d mine(options, q, /*sync_bn=*/true);
  load_state_dict(*mine, state_dict(*whole));
  set_sync_batch_norm_group(*mine, dist.c10d_group());
  for (auto* m : {&whole, &mine}) (*m)->activation_post_process->enable_fake_quant(false);
  double worst = 0;
  for (int step = 0; step < 3; ++step) {
    if (step == 2) {
      qat::freeze_bn_stats(*whole);
      qat::freeze_bn_stats(*mine);
    }
    const auto x = torch::randn({world * per_rank, 2, 5, 5}) * (1 + step) + step;
    const auto all = whole(x);
    const auto part = mine(x.narrow(0, rank * per_rank, per_rank));
    worst = std::max(worst, (part - all.narrow(0, rank * per_rank, per_rank)).abs().max().item<double>());
    worst = std::max(worst, (mine->sync_bn->running_var - whole->bn->running_var).abs().max().item<double>());
    worst = std::max(worst, (mine->sync_bn->running_mean - whole->bn->running_mean).abs().max().item<double>());
  }
  dist.print("RESULT qat_sync_bn_vs_whole_batch=", all_max(dist, worst));
  dist.print("RESULT qat_sync_bn_batches=", mine->sync_bn->num_batches_tracked.item<int64_t>());
  return 0;
}

// clone() of a trained QAT model (prepare_qat's QuantWrapper over a Sequential of ConvBnReLU2d,
// ConvBn2d, LinearReLU, Linear, with per-channel observers and BatchNorm frozen): the same types,
// the same state dict to the bit, the same outputs in training and evaluation, tensors of its own,
// no random numbers drawn; then the same for the converted int8 model. One process, no DDP.
int qat_clone() {
  using namespace torch::nn;
  auto dist = Distributed::init();
  torch::manual_seed(3);
  Sequential seq(Conv2d(Conv2dOptions(1, 4, 3).padding(1)), BatchNorm2d(4), ReLU(), MaxPool2d(MaxPool2dOptions(2)),
                 Conv2d(4, 6, 3), BatchNorm2d(6), Flatten(), torch::nn::Linear(24, 16), ReLU(),
                 torch::nn::Linear(16, 5));
  auto model = qat::prepare_qat(seq, qat::default_qat_qconfig("onednn"), {{0, 1, 2}, {4, 5}, {7, 8}});
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = global_batch(step, 1, 4);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model(x), y).backward();
    opt.step();
  }
  qat::freeze_bn_stats(*model);
  const auto x = std::get<0>(global_batch(7, 1, 4));
  auto differs = [](const c10::impl::GenericDict& a, const c10::impl::GenericDict& b) {
    int64_t n = 0;
    if (a.size() != b.size()) return int64_t{-1};
    for (const auto& entry : a) {
      if (!entry.value().isTensor()) continue;
      const auto& ta = entry.value().toTensor();
      if (!b.contains(entry.key())) return int64_t{-1};
      const auto tb = b.at(entry.key()).toTensor();
      if (!ta.sizes().equals(tb.sizes()) || !torch::equal(ta, tb)) ++n;
    }
    return n;
  };
  const auto rng_before = at::detail::getDefaultCPUGenerator().get_state();
  const auto copy = std::dynamic_pointer_cast<qat::QuantWrapperImpl>(model->clone());
  const bool rng_untouched = torch::equal(rng_before, at::detail::getDefaultCPUGenerator().get_state());
  if (!copy) throw std::runtime_error("clone() of a QuantWrapper is not a QuantWrapperImpl");
  int types = 0;
  for (size_t i : {0, 4, 7, 9}) {  // ConvBnReLU2d, ConvBn2d, LinearReLU, Linear (Identity where fused away)
    const auto& a = *model->module->ptr(i);
    const auto& b = *copy->module->ptr(i);
    std::ostringstream pa, pb;
    a.pretty_print(pa);
    b.pretty_print(pb);
    types += typeid(a) == typeid(b) && pa.str() == pb.str() && &a != &b;
  }
  const int64_t state_diffs = differs(state_dict(*model), state_dict(*copy));
  const double train_diff = (model(x) - copy->forward(x)).abs().max().item<double>();  // frozen BatchNorm in both
  model->eval();
  copy->eval();
  torch::NoGradGuard no_grad;
  const double eval_diff = (model(x) - copy->forward(x)).abs().max().item<double>();
  copy->module->ptr(0)->parameters()[0].add_(1);  // the clone's weights are its own
  const int64_t shared_after_write = differs(state_dict(*model), state_dict(*copy));
  qat::convert(*model, "onednn");
  const auto int8_copy = std::dynamic_pointer_cast<qat::QuantWrapperImpl>(model->clone());
  const double int8_diff = (model(x) - int8_copy->forward(x)).abs().max().item<double>();
  dist.print("RESULT qat_clone_types=", types);
  dist.print("RESULT qat_clone_state_diffs=", state_diffs);
  dist.print("RESULT qat_clone_train_diff=", train_diff);
  dist.print("RESULT qat_clone_eval_diff=", eval_diff);
  dist.print("RESULT qat_clone_rng_untouched=", rng_untouched ? 1 : 0);
  dist.print("RESULT qat_clone_diffs_after_write=", shared_after_write);
  dist.print("RESULT qat_clone_int8_diff=", int8_diff);
  dist.print("RESULT qat_clone_int8_converted=", int8_copy->quant->converted() ? 1 : 0);
  return 0;
}

}  // namespace ddprun::test::sdk_worker
