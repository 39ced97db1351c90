// A 784-512-10 multilayer perceptron with log-softmax and NLL loss on Fashion-MNIST.
//   ddprun --nproc_per_node 2 mlp --epochs 3
#include "common/trainer.hpp"

using namespace ddprun::examples;

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : hidden(register_module("hidden", torch::nn::Linear(784, 512))),
        out(register_module("out", torch::nn::Linear(512, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    return torch::log_softmax(out(torch::relu(hidden(x.flatten(1)))), /*dim=*/1);
  }
  torch::nn::Linear hidden, out;
};

int main(int argc, char** argv) {
  ExampleFlags defaults;
  defaults.epochs = 3;
  defaults.batch_size = 64;
  defaults.lr = 0.02;
  const auto flags =
      parse_example_flags(argc, argv, "mlp", "A 784-512-10 MLP (log-softmax + NLL) on Fashion-MNIST.", defaults);
  try {
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    auto train = load_fashion_mnist("train", flags.train_limit, flags.data_dir);
    auto test = load_fashion_mnist("test", flags.test_limit, flags.data_dir);
    return train_classifier("mlp", flags, std::make_shared<MlpImpl>(), train, test, Loss::NllOfLogSoftmax);
  } catch (const std::exception& e) {
    std::cerr << "mlp: " << e.what() << "\n";
    return 1;
  }
}
