// Quantization-aware training of LeNet-5 with BatchNorm on Fashion-MNIST, data-parallel, then an
// int8 model: the flow of torchvision's references/classification/train_quantization.py.
//   ddprun --nproc_per_node 2 fashion_mnist_qat --epochs 3
// The network is trained in float for --epochs epochs (the FP32 baseline), then fused and
// prepared for QAT from those weights and fine-tuned with fake quantization for 5 epochs at a
// tenth of the learning rate (observers until epoch 4, BatchNorm statistics until epoch 3, as the
// reference's defaults), the float model fine-tuned alongside as the baseline. The QAT model is then converted to int8 on each quantized engine
// LibTorch has; rank 0 times FP32 and int8 inference at batch 256 on the CPU, measures the two
// models' sizes, and prints a final JSON line. Training runs where the process group puts it (GPU
// LOCAL_RANK under NCCL, the SDK's choice where CUDA is); int8 inference runs on the CPU, where
// its kernels are:
//   {"example": "fashion_mnist_qat", ..., "fp32_accuracy", "fake_quant_accuracy", "int8_accuracy",
//    "int8_engine", "fp32_ms_per_batch", "int8_ms_per_batch": {engine: ms}, "fp32_bytes", "int8_bytes"}
// examples/python/fashion_mnist_qat.py is the same in Python (prepare_qat, convert).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/fashion_mnist.hpp"
#include "common/flags.hpp"
#include "common/progress.hpp"
#include "ddprun/worker.hpp"

using namespace ddprun;
using namespace ddprun::examples;
namespace qat = ddprun::worker::qat;

namespace {

constexpr int kQatEpochs = 5;
constexpr int kObserverEpochs = 4;   // torchvision's --num-observer-update-epochs
constexpr int kBatchNormEpochs = 3;  // --num-batch-norm-update-epochs

// The float network: Conv+BN+ReLU twice, three Linear layers.
struct LeNetBnImpl : torch::nn::Module {
  LeNetBnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 5).padding(2)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(6))),
        conv2(register_module("conv2", torch::nn::Conv2d(6, 16, 5))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(16))),
        fc1(register_module("fc1", torch::nn::Linear(16 * 5 * 5, 120))),
        fc2(register_module("fc2", torch::nn::Linear(120, 84))),
        fc3(register_module("fc3", torch::nn::Linear(84, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), {2, 2}, {}, {0, 0}, {1, 1});
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), {2, 2}, {}, {0, 0}, {1, 1});
    x = torch::relu(fc1(x.flatten(1)));
    return fc3(torch::relu(fc2(x)));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc1, fc2, fc3;
};

// The same network fused and prepared for QAT (Python: fuse_modules_qat + prepare_qat).
struct QatLeNetImpl : torch::nn::Module {
  explicit QatLeNetImpl(const qat::QConfig& q)
      : quant(register_module("quant", qat::QuantStub(q))),
        conv1(register_module("conv1", qat::ConvBnReLU2d(torch::nn::Conv2dOptions(1, 6, 5).padding(2), q))),
        conv2(register_module("conv2", qat::ConvBnReLU2d(torch::nn::Conv2dOptions(6, 16, 5), q))),
        fc1(register_module("fc1", qat::LinearReLU(torch::nn::LinearOptions(16 * 5 * 5, 120), q))),
        fc2(register_module("fc2", qat::LinearReLU(torch::nn::LinearOptions(120, 84), q))),
        fc3(register_module("fc3", qat::Linear(torch::nn::LinearOptions(84, 10), q))),
        dequant(register_module("dequant", qat::DeQuantStub())) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(conv1(quant(x)), {2, 2}, {}, {0, 0}, {1, 1});
    x = torch::max_pool2d(conv2(x), {2, 2}, {}, {0, 0}, {1, 1});
    return dequant(fc3(fc2(fc1(x.flatten(1)))));
  }
  qat::QuantStub quant;
  qat::ConvBnReLU2d conv1, conv2;
  qat::LinearReLU fc1, fc2;
  qat::Linear fc3;
  qat::DeQuantStub dequant;
};

torch::Device device_of(torch::nn::Module& model) {
  const auto params = model.parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

template <class Model>
double accuracy(worker::Distributed& dist, Model& model, const Dataset& test) {
  torch::NoGradGuard no_grad;
  model.eval();
  const auto device = device_of(model);
  const int64_t total = test.size();
  const int64_t begin = total * dist.rank() / dist.world_size(), end = total * (dist.rank() + 1) / dist.world_size();
  double right = 0;
  for (int64_t at = begin; at < end; at += 512) {
    const auto n = std::min<int64_t>(512, end - at);
    const auto out = model.forward(test.inputs.narrow(0, at, n).to(device));
    right += out.argmax(1).eq(test.labels.narrow(0, at, n).to(device)).sum().template item<double>();
  }
  return dist.sum(right) / static_cast<double>(std::max<int64_t>(total, 1));
}

// One epoch of data-parallel SGD; returns the mean loss over all ranks.
template <class Impl>
double train_epoch(worker::Distributed& dist, worker::DistributedDataParallel<Impl>& ddp, torch::optim::SGD& opt,
                   worker::RankSampler& sampler, const Dataset& train, const ExampleFlags& flags, int epoch) {
  ddp.module().train();
  sampler.set_epoch(static_cast<uint64_t>(epoch));
  const auto indices = torch::tensor(sampler.indices(), torch::kLong);
  double loss_sum = 0, seen = 0;
  int64_t step = 0;
  const int64_t steps = (indices.size(0) + flags.batch_size - 1) / flags.batch_size;
  EpochProgress progress(flags.progress && dist.rank() == 0, epoch, flags.epochs + kQatEpochs,
                         flags.max_steps > 0 ? std::min(steps, flags.max_steps) : steps);
  for (int64_t at = 0; at < indices.size(0); at += flags.batch_size, ++step) {
    if (flags.max_steps > 0 && step >= flags.max_steps) break;
    progress.update(step);
    const auto idx = indices.narrow(0, at, std::min<int64_t>(flags.batch_size, indices.size(0) - at));
    const auto x = train.inputs.index_select(0, idx).to(dist.device());
    const auto y = train.labels.index_select(0, idx).to(dist.device());
    opt.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(ddp(x), y);
    loss.backward();
    opt.step();
    loss_sum += loss.template item<double>() * static_cast<double>(y.size(0));
    seen += static_cast<double>(y.size(0));
  }
  progress.finish();
  return dist.sum(loss_sum) / dist.sum(seen);
}

// Milliseconds per forward of a batch of `batch` (the median of `reps` after a warm-up).
template <class Model>
double ms_per_batch(Model& model, const torch::Tensor& batch, int reps = 15) {
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 3; ++i) model.forward(batch);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    model.forward(batch);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int64_t float_bytes(torch::nn::Module& model) {
  int64_t bytes = 0;
  for (const auto& p : model.parameters()) bytes += p.numel() * p.element_size();
  for (const auto& b : model.buffers()) bytes += b.numel() * b.element_size();
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  ExampleFlags defaults;
  defaults.epochs = 3;
  defaults.batch_size = 64;
  defaults.lr = 0.05;
  const auto flags = parse_example_flags(
      argc, argv, "fashion_mnist_qat",
      "LeNet-5 with BatchNorm on Fashion-MNIST: FP32 and quantization-aware training, then int8.", defaults);
  try {
    auto dist = worker::Distributed::init();
    const auto train = load_fashion_mnist("train", flags.train_limit, flags.data_dir);
    const auto test = load_fashion_mnist("test", flags.test_limit, flags.data_dir);
    worker::RankSampler sampler(train.size(), dist, worker::SamplerOptions().seed(flags.seed));
    const auto sgd = torch::optim::SGDOptions(flags.lr).momentum(0.9);
    const std::string engine = "qnnpack";  // the QAT qconfig: per-tensor weights run on both engines
    dist.print("fashion_mnist_qat: ", train.size(), " training samples, ", dist.world_size(), " worker(s) x batch ",
               flags.batch_size, ", ", flags.epochs, " epochs, qconfig ", engine);

    const auto t0 = std::chrono::steady_clock::now();
    torch::manual_seed(flags.seed);
    auto fp32 = std::make_shared<LeNetBnImpl>();
    fp32->to(dist.device());
    worker::DistributedDataParallel<LeNetBnImpl> fp32_ddp(fp32, dist);
    torch::optim::SGD fp32_opt(fp32_ddp.parameters(), sgd);
    for (int epoch = 0; epoch < flags.epochs; ++epoch) {
      const double loss = train_epoch(dist, fp32_ddp, fp32_opt, sampler, train, flags, epoch);
      char line[160];
      std::snprintf(line, sizeof line, "fp32 epoch %d/%d: loss %.4f, test accuracy %.4f", epoch + 1, flags.epochs, loss,
                    accuracy(dist, *fp32, test));
      dist.print(line);
    }
    // fuse_modules_qat + prepare_qat: the fused modules take the float model's weights, BatchNorm's
    // under <conv>.bn.
    auto model = std::make_shared<QatLeNetImpl>(qat::default_qat_qconfig(engine));
    {
      auto fused = worker::state_dict(*fp32);
      c10::impl::GenericDict renamed(c10::StringType::get(), c10::AnyType::get());
      for (const auto& kv : fused) {
        std::string name = kv.key().toStringRef();
        if (name == "_metadata") continue;
        if (name.rfind("bn1.", 0) == 0) name = "conv1.bn." + name.substr(4);
        if (name.rfind("bn2.", 0) == 0) name = "conv2.bn." + name.substr(4);
        renamed.insert(name, kv.value());
      }
      worker::load_state_dict(*model, renamed, /*strict=*/false);
    }
    model->to(dist.device());
    worker::DistributedDataParallel<QatLeNetImpl> ddp(model, dist);
    const auto fine_tune = torch::optim::SGDOptions(flags.lr / 10).momentum(0.9);
    torch::optim::SGD opt(ddp.parameters(), fine_tune);
    // The FP32 baseline is fine-tuned alongside, the same epochs at the same rate without fake
    // quantization: the int8 model is held to a float model of the same training.
    for (auto& group : fp32_opt.param_groups())
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(fine_tune.lr());
    for (int epoch = 0; epoch < kQatEpochs; ++epoch) {
      if (epoch == kBatchNormEpochs) qat::freeze_bn_stats(*model);
      if (epoch == kObserverEpochs) qat::enable_observer(*model, false);
      const double fp32_loss = train_epoch(dist, fp32_ddp, fp32_opt, sampler, train, flags, flags.epochs + epoch);
      const double loss = train_epoch(dist, ddp, opt, sampler, train, flags, flags.epochs + epoch);
      char line[240];
      std::snprintf(
          line, sizeof line, "qat epoch %d/%d: loss %.4f, fake-quant test accuracy %.4f (fp32: %.4f, %.4f)%s%s",
          epoch + 1, kQatEpochs, loss, accuracy(dist, *model, test), fp32_loss, accuracy(dist, *fp32, test),
          epoch >= kBatchNormEpochs ? ", BatchNorm frozen" : "", epoch >= kObserverEpochs ? ", observers off" : "");
      dist.print(line);
    }
    const double train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    qat::enable_observer(*model, false);  // as before convert in torchvision's reference
    const double fp32_accuracy = accuracy(dist, *fp32, test);
    const double fake_quant_accuracy = accuracy(dist, *model, test);
    fp32->to(torch::kCPU);  // inference compared where the int8 model runs

    // int8 on each engine LibTorch has: accuracy, and (rank 0 alone, the others waiting) the
    // inference time at batch 256 beside the FP32 model's.
    const auto batch = test.inputs.narrow(0, 0, std::min<int64_t>(256, test.size()));
    dist.barrier();
    const double fp32_ms = dist.sum(dist.is_main() ? ms_per_batch(*fp32, batch) : 0.0);  // rank 0's, everywhere
    std::map<std::string, double> int8_ms, int8_accuracy;
    for (const std::string e : {"qnnpack", "onednn", "fbgemm"}) {
      bool have = false;
      for (const auto q : at::globalContext().supportedQEngines()) {
        have = have || (e == "qnnpack" && q == at::QEngine::QNNPACK) || (e == "onednn" && q == at::QEngine::ONEDNN) ||
               (e == "fbgemm" && q == at::QEngine::FBGEMM);
      }
      if (!have) continue;
      qat::convert(*model, e);
      int8_accuracy[e] = accuracy(dist, *model, test);
      dist.barrier();
      int8_ms[e] = dist.sum(dist.is_main() ? ms_per_batch(*model, batch) : 0.0);
    }
    std::string best;
    for (const auto& [e, ms] : int8_ms) {
      if (best.empty() || ms < int8_ms[best]) best = e;
    }
    if (best.empty()) throw std::runtime_error("this LibTorch has no quantized engine (qnnpack, onednn, fbgemm)");
    qat::convert(*model, best);
    const int64_t fp32_bytes = float_bytes(*fp32), int8_bytes = qat::quantized_bytes(*model);

    char line[256];
    std::snprintf(line, sizeof line, "test accuracy: fp32 %.4f, fake-quant %.4f, int8 (%s) %.4f", fp32_accuracy,
                  fake_quant_accuracy, best.c_str(), int8_accuracy[best]);
    dist.print(line);
    std::string times;
    for (const auto& [e, ms] : int8_ms) {
      char t[96];
      std::snprintf(t, sizeof t, "%s\"%s\": %.3f", times.empty() ? "" : ", ", e.c_str(), ms);
      times += t;
      std::snprintf(line, sizeof line, "batch 256 on rank 0: fp32 %.3f ms, int8 on %s %.3f ms (%.2fx)", fp32_ms,
                    e.c_str(), ms, fp32_ms / ms);
      dist.print(line);
    }
    std::snprintf(line, sizeof line, "model size: fp32 %lld bytes, int8 %lld bytes (%.1f%%)",
                  static_cast<long long>(fp32_bytes), static_cast<long long>(int8_bytes),
                  100.0 * static_cast<double>(int8_bytes) / static_cast<double>(fp32_bytes));
    dist.print(line);
    char json[768];
    std::snprintf(
        json, sizeof json,
        "{\"example\": \"fashion_mnist_qat\", \"world_size\": %d, \"epochs\": %d, \"batch_size_per_rank\": %d, "
        "\"fp32_accuracy\": %.4f, \"fake_quant_accuracy\": %.4f, \"int8_accuracy\": %.4f, \"int8_engine\": "
        "\"%s\", \"fp32_ms_per_batch\": %.3f, \"int8_ms_per_batch\": {%s}, \"fp32_bytes\": %lld, "
        "\"int8_bytes\": %lld, \"train_seconds\": %.1f}",
        dist.world_size(), flags.epochs + kQatEpochs, flags.batch_size, fp32_accuracy, fake_quant_accuracy,
        int8_accuracy[best], best.c_str(), fp32_ms, times.c_str(), static_cast<long long>(fp32_bytes),
        static_cast<long long>(int8_bytes), train_seconds);
    dist.print(json);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist_qat: " << e.what() << "\n";
    return 1;
  }
}
