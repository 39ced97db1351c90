#pragma once
// LeNet-5 for 1x28x28 inputs, shared by the fashion_mnist_lenet example and the DDP benchmark.

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/pooling.h>

namespace ddprun::examples {

struct LeNetImpl : torch::nn::Module {
  LeNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 5).padding(2)))),
        conv2(register_module("conv2", torch::nn::Conv2d(6, 16, 5))),
        fc1(register_module("fc1", torch::nn::Linear(16 * 5 * 5, 120))),
        fc2(register_module("fc2", torch::nn::Linear(120, 84))),
        fc3(register_module("fc3", torch::nn::Linear(84, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc3(torch::relu(fc2(x)));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2, fc3;
};

}  // namespace ddprun::examples
