// ResNet-18 for 28x28 images (3x3 stem, stride 1, no max-pool) on Fashion-MNIST, showing the
// linear learning-rate scaling rule: --lr is the rate for a global batch of 256, and the rate used
// is lr x (batch_size x WORLD_SIZE) / 256, e.g. 256 at 0.1 on one worker, 512 at 0.2 on two.
//   ddprun --nproc_per_node 2 resnet18 --batch-size 256 --max-steps 20
#include "common/resnet18.hpp"
#include "common/trainer.hpp"

using namespace ddprun::examples;

int main(int argc, char** argv) {
  ExampleFlags defaults;
  defaults.epochs = 1;
  defaults.batch_size = 256;
  defaults.lr = 0.1;
  auto flags = parse_example_flags(argc, argv, "resnet18",
                                   "ResNet-18 (3x3 stem, no max-pool) on Fashion-MNIST with linear lr scaling; "
                                   "--lr is the rate for a global batch of 256.",
                                   defaults);
  try {
    const int world = ddprun::worker::WorkerEnv::from_environment().world_size;
    const double base = flags.lr;
    flags.lr = base * flags.batch_size * world / 256.0;
    if (ddprun::worker::WorkerEnv::from_environment().rank == 0) {
      std::printf("resnet18: lr %.3g for a global batch of 256, scaled to %.3g for %d x %d\n", base, flags.lr,
                  flags.batch_size, world);
    }
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    auto train = load_fashion_mnist("train", flags.train_limit, flags.data_dir);
    auto test = load_fashion_mnist("test", flags.test_limit, flags.data_dir);
    return train_classifier("resnet18", flags, std::make_shared<ResNet18Impl>(), train, test, Loss::CrossEntropy);
  } catch (const std::exception& e) {
    std::cerr << "resnet18: " << e.what() << "\n";
    return 1;
  }
}
