// LeNet-5 on Fashion-MNIST: the textbook data-parallel example.
//   ddprun --nproc_per_node 2 fashion_mnist_lenet --epochs 3
#include "common/lenet.hpp"
#include "common/trainer.hpp"

using namespace ddprun::examples;

int main(int argc, char** argv) {
  ExampleFlags defaults;
  defaults.epochs = 3;
  defaults.batch_size = 64;
  defaults.lr = 0.05;
  const auto flags = parse_example_flags(argc, argv, "fashion_mnist_lenet", "LeNet-5 on Fashion-MNIST.", defaults);
  try {
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    auto train = load_fashion_mnist("train", flags.train_limit, flags.data_dir);
    auto test = load_fashion_mnist("test", flags.test_limit, flags.data_dir);
    return train_classifier("fashion_mnist_lenet", flags, std::make_shared<LeNetImpl>(), train, test,
                            Loss::CrossEntropy);
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist_lenet: " << e.what() << "\n";
    return 1;
  }
}
