// The two-convolution ToyModel on 3x32x32 inputs (synthetic data with a learnable labelling),
// showing per-rank batch semantics (global batch = per-rank batch x WORLD_SIZE), sampler
// set_epoch, and a checkpoint on rank 0 every epoch.
//   ddprun --nproc_per_node 2 toy_cnn --epochs 3 --checkpoint-dir /tmp/toy
#include "common/trainer.hpp"

using namespace ddprun::examples;

struct ToyModelImpl : torch::nn::Module {
  ToyModelImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(32 * 8 * 8, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc(x.flatten(1));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};

// Random images labelled by a fixed random linear map (learnable, identical on every rank).
Dataset synthetic(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  Dataset d;
  d.inputs = torch::randn({n, 3, 32, 32});
  torch::manual_seed(12345);
  const auto projection = torch::randn({3 * 32 * 32, 10});
  d.labels = d.inputs.flatten(1).mm(projection).argmax(1);
  return d;
}

int main(int argc, char** argv) {
  ExampleFlags defaults;
  defaults.epochs = 3;
  defaults.batch_size = 32;
  defaults.lr = 0.01;
  const auto flags =
      parse_example_flags(argc, argv, "toy_cnn", "The two-conv ToyModel on synthetic 3x32x32 data.", defaults);
  try {
    const auto train = synthetic(flags.train_limit > 0 ? flags.train_limit : 8192, 1);
    const auto test = synthetic(flags.test_limit > 0 ? flags.test_limit : 1024, 2);
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    return train_classifier("toy_cnn", flags, std::make_shared<ToyModelImpl>(), train, test, Loss::CrossEntropy);
  } catch (const std::exception& e) {
    std::cerr << "toy_cnn: " << e.what() << "\n";
    return 1;
  }
}
