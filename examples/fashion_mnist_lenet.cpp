// LeNet-5 on Fashion-MNIST: the textbook data-parallel example.
//   ddprun --nproc_per_node 2 fashion_mnist_lenet --epochs 3
#include "common/trainer.hpp"

using namespace ddprun::examples;

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

int main(int argc, char** argv) {
  ExampleFlags defaults;
  defaults.epochs = 3;
  defaults.batch_size = 64;
  defaults.lr = 0.05;
  const auto flags = parse_example_flags(argc, argv, "fashion_mnist_lenet", "LeNet-5 on Fashion-MNIST.", defaults);
  try {
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    auto train = load_fashion_mnist("train", flags.train_limit);
    auto test = load_fashion_mnist("test", flags.test_limit);
    return train_classifier("fashion_mnist_lenet", flags, std::make_shared<LeNetImpl>(), train, test,
                            Loss::CrossEntropy);
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist_lenet: " << e.what() << "\n";
    return 1;
  }
}
