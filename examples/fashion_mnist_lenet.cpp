// LeNet-5 on Fashion-MNIST: the textbook data-parallel example.
//   ddprun --nproc_per_node 2 fashion_mnist_lenet --epochs 3
// --fault-tolerant: one replica group of a job that trains on through failures, e.g. group 0 of 2:
//   ddprun --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint HOST:PORT --rdzv_id JOB
//          --replica_group 0 --min_replica_groups 1 fashion_mnist_lenet --fault-tolerant
#include "common/lenet.hpp"
#include "common/trainer.hpp"
#if DDPRUN_WORKER_HAS_FT
#include "common/ft_trainer.hpp"
#endif

using namespace ddprun::examples;

int main(int argc, char** argv) {
  ExampleFlags defaults;
  defaults.epochs = 3;
  defaults.batch_size = 64;
  defaults.lr = 0.05;
  defaults.offers_fault_tolerant = DDPRUN_WORKER_HAS_FT + 0 == 1;
  const auto flags = parse_example_flags(argc, argv, "fashion_mnist_lenet", "LeNet-5 on Fashion-MNIST.", defaults);
  try {
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    auto train = load_fashion_mnist("train", flags.train_limit, flags.data_dir);
    auto test = load_fashion_mnist("test", flags.test_limit, flags.data_dir);
#if DDPRUN_WORKER_HAS_FT
    if (flags.fault_tolerant)
      return train_fault_tolerant("fashion_mnist_lenet", flags, std::make_shared<LeNetImpl>(), train, test,
                                  Loss::CrossEntropy);
#endif
    return train_classifier("fashion_mnist_lenet", flags, std::make_shared<LeNetImpl>(), train, test,
                            Loss::CrossEntropy);
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist_lenet: " << e.what() << "\n";
    return 1;
  }
}
