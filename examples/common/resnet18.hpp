#pragma once
// ResNet-18 for 1x28x28 images (3x3 stem, stride 1, no max-pool), shared by the resnet18 example
// and the DDP benchmark (benchmarks/ddp_bench.py has the same network in Python). Its batch norms
// are the SDK's SyncBatchNorm: BatchNorm2d exactly until given a process group
// (ddprun::worker::set_sync_batch_norm_group, the examples' --sync-bn), the same state dict keys.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "ddprun/worker/sync_batch_norm.hpp"

namespace ddprun::examples {

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      // In declaration order, the order they are registered in (and their parameters listed).
      : conv1(register_module(
            "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        conv2(
            register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", ddprun::worker::SyncBatchNorm(out))),
        bn2(register_module("bn2", ddprun::worker::SyncBatchNorm(out))) {
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut",
          torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                ddprun::worker::SyncBatchNorm(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = bn2(conv2(torch::relu(bn1(conv1(x)))));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }
  torch::nn::Conv2d conv1, conv2;
  ddprun::worker::SyncBatchNorm bn1, bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNet18Impl : torch::nn::Module {
  ResNet18Impl()
      : stem(register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 64, 3).padding(1).bias(false)))),
        bn(register_module("bn", ddprun::worker::SyncBatchNorm(64))),
        fc(register_module("fc", torch::nn::Linear(512, 10))) {
    int64_t in = 64;
    const int64_t widths[] = {64, 128, 256, 512};
    for (int stage = 0; stage < 4; ++stage) {
      torch::nn::Sequential seq;
      for (int b = 0; b < 2; ++b) {
        seq->push_back(BasicBlock(in, widths[stage], b == 0 && stage > 0 ? 2 : 1));
        in = widths[stage];
      }
      layers.push_back(register_module("layer" + std::to_string(stage + 1), seq));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn(stem(x)));
    for (auto& layer : layers) x = layer->forward(x);
    return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
  torch::nn::Conv2d stem;
  ddprun::worker::SyncBatchNorm bn;
  torch::nn::Linear fc;
  std::vector<torch::nn::Sequential> layers;
};

}  // namespace ddprun::examples
