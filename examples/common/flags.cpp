#include "common/flags.hpp"

#include <cstdlib>
#include <iostream>

namespace ddprun::examples {

ExampleFlags parse_example_flags(int argc, char** argv, const std::string& name, const std::string& description,
                                 ExampleFlags f) {
  const ExampleFlags d = f;
  auto usage = [&](std::ostream& out) {
    out << "usage: " << name << " [flags]   (alone, or under: ddprun --nproc_per_node N " << name << " ...)\n"
        << description << "\n\n"
        << "  --epochs N          training epochs (default " << d.epochs << ")\n"
        << "  --batch-size N      samples per rank per step; global batch = N x WORLD_SIZE (default " << d.batch_size
        << ")\n"
        << "  --lr X              learning rate (default " << d.lr << ")\n"
        << "  --checkpoint-dir D  rank 0 saves D/checkpoint.pt after every epoch\n"
        << "  --data-dir D        Fashion-MNIST's .gz files (default " << d.data_dir << ")\n"
        << "  --resume            continue from D/checkpoint.pt (automatic after a ddprun restart)\n"
        << "  --max-steps N       stop each epoch after N steps (default: whole epoch)\n"
        << "  --crash-at-step N   fault injection: rank 0 exits with status 1 once the run has completed N\n"
        << "                      steps, counted across restarts (a resumed run goes on from its count)\n"
        << "  --train-limit N     use the first N training samples (default: all)\n"
        << "  --test-limit N      use the first N test samples (default: all)\n"
        << "  --seed N            shuffling and initialisation seed (default " << d.seed << ")\n"
        << "  --comm-hook H       DDP communication hook: allreduce, fp16, bf16 or powersgd:RANK (default:\n"
        << "                      none, DDP's own average); fp16 and bf16 send gradients in 16 bits,\n"
        << "                      powersgd:RANK low-rank factors of rank RANK (1-64) with error feedback\n"
        << "                      after " << kPowerSgdStartIter << " plain iterations\n"
        << "  --sync-bn           batch norm statistics over every rank's batch (models with batch norm)\n"
        << "  --zero              shard the optimizer's state over the ranks (ZeroRedundancyOptimizer)\n"
        << "  --no-progress       no progress of each epoch (rank 0 shows a bar on a terminal, a line at\n"
        << "                      each quarter of an epoch elsewhere)\n";
    if (d.offers_fault_tolerant)
      out << "  --fault-tolerant    train as one replica group of a job that trains on through failures:\n"
          << "                      start it with ddprun --replica_group ID (docs/fault-tolerance.md)\n"
          << "  --commit-log FILE   with --fault-tolerant: append a JSON line per committed step\n";
  };
  auto fail = [&](const std::string& msg) {
    std::cerr << name << ": " << msg << "\n";
    usage(std::cerr);
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "-h" || flag == "--help") {
      usage(std::cout);
      std::exit(0);
    }
    if (flag == "--resume") {
      f.resume = true;
      continue;
    }
    if (flag == "--sync-bn" || flag == "--zero") {
      (flag == "--zero" ? f.zero : f.sync_bn) = true;
      continue;
    }
    if (flag == "--no-progress") {
      f.progress = false;
      continue;
    }
    if ((flag == "--fault-tolerant" || flag.rfind("--commit-log", 0) == 0) && !d.offers_fault_tolerant)
      fail(flag + ": " + name + " has no fault-tolerant mode (fashion_mnist_lenet has one)");
    if (flag == "--fault-tolerant") {
      f.fault_tolerant = true;
      continue;
    }
    const auto eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      fail(flag + " needs a value");
    }
    auto number = [&](double lo) {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || v < lo)
        fail(flag + ": expected a number >= " + std::to_string(lo) + ", got '" + value + "'");
      return v;
    };
    if (flag == "--epochs") f.epochs = static_cast<int>(number(1));
    else if (flag == "--batch-size") f.batch_size = static_cast<int>(number(1));
    else if (flag == "--lr") f.lr = number(0);
    else if (flag == "--checkpoint-dir") f.checkpoint_dir = value;
    else if (flag == "--data-dir") f.data_dir = value;
    else if (flag == "--commit-log") f.commit_log = value;
    else if (flag == "--max-steps") f.max_steps = static_cast<int64_t>(number(0));
    else if (flag == "--crash-at-step") f.crash_at_step = static_cast<int64_t>(number(1));
    else if (flag == "--train-limit") f.train_limit = static_cast<int64_t>(number(0));
    else if (flag == "--test-limit") f.test_limit = static_cast<int64_t>(number(0));
    else if (flag == "--seed") f.seed = static_cast<uint64_t>(number(0));
    else if (flag == "--comm-hook") {
      // The spellings of the SDK's comm_hooks::parse_builtin, and powersgd:RANK.
      if (value.rfind("powersgd:", 0) == 0) {
        const std::string rank = value.substr(9);
        char* end = nullptr;
        const long r = rank.empty() ? 0 : std::strtol(rank.c_str(), &end, 10);
        if (rank.empty() || *end != '\0' || r < 1 || r > 64) {
          fail("--comm-hook: powersgd:RANK takes a rank from 1 to 64, got '" + value + "'");
        }
        f.powersgd_rank = r;
      } else if (value != "allreduce" && value != "fp16" && value != "bf16") {
        fail("--comm-hook: expected allreduce, fp16, bf16 or powersgd:RANK, got '" + value + "'");
      }
      f.comm_hook = value;
    } else fail("unknown flag " + flag);
  }
  if (!f.commit_log.empty() && !f.fault_tolerant) fail("--commit-log needs --fault-tolerant");
  if (f.fault_tolerant && (!f.comm_hook.empty() || f.zero || f.sync_bn || !f.checkpoint_dir.empty() || f.resume ||
                           f.max_steps > 0 || f.crash_at_step > 0))
    fail(
        "--fault-tolerant takes none of --comm-hook, --zero, --sync-bn, --checkpoint-dir, --resume, --max-steps and "
        "--crash-at-step: "
        "its own hook averages over the groups, and a restarted group heals from its peers, not a checkpoint");
  return f;
}

}  // namespace ddprun::examples
