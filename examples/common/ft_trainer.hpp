#pragma once
// The examples' --fault-tolerant loop: this program is one replica group of a job that trains on
// through failures (docs/fault-tolerance.md). DDP inside the group, ft::Manager across the groups,
// the batches drawn by ft::Sampler from the committed steps, so a group that dies, comes back and
// heals from a peer neither trains a sample twice nor skips one. The C++ twin of
// examples/python/fashion_mnist_ddp.py --fault-tolerant: the same model, samples, log lines and
// final JSON line, so one job may mix the two and their commits be compared bit for bit.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/trainer.hpp"
#include "ddprun/worker/fault_tolerance.hpp"

namespace ddprun::examples {

template <typename Impl>
int train_fault_tolerant(const std::string& name, const ExampleFlags& flags, std::shared_ptr<Impl> model,
                         const Dataset& train, const Dataset& test, Loss loss_kind) {
  using Clock = std::chrono::steady_clock;
  namespace ft = worker::ft;
  if (std::getenv("DDPRUN_REPLICA_GROUP") == nullptr) {
    std::fprintf(stderr,
                 "%s: --fault-tolerant trains one replica group of a job: start it with ddprun --replica_group ID "
                 "--rdzv_backend c10d --rdzv_endpoint HOST:PORT --rdzv_id JOB (docs/fault-tolerance.md)\n",
                 name.c_str());
    return 2;
  }
  auto dist = worker::Distributed::init();
  const auto device = dist.device();
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(flags.lr).momentum(0.9));
  ft::Sampler sampler(train.size(), flags.batch_size, flags.seed);
  auto manager = std::make_shared<ft::Manager>(dist, ft::model_state(*model, opt, &sampler),
                                               ft::load_model_state(*model, opt, &sampler));
  worker::DistributedDataParallel<Impl> ddp(model, dist, worker::DdpOptions().find_unused_parameters(true));
  ft::register_hook(ddp, manager);
  // One write(2) per line on an O_APPEND descriptor. A process SIGKILLed in the middle of one (what
  // the fault tests do) may still leave a torn line: the kernel stops a write at a page boundary when
  // a fatal signal is pending. So a process that finds the log ending mid-line ends that line first,
  // and its own lines stay whole; readers skip the torn one.
  int log = -1;
  if (!flags.commit_log.empty()) {
    log = ::open(flags.commit_log.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log < 0)
      throw std::runtime_error("cannot append to --commit-log " + flags.commit_log + ": " + std::strerror(errno));
    char last = '\n';
    const off_t size = ::lseek(log, 0, SEEK_END);
    if (size > 0 && ::pread(log, &last, 1, size - 1) == 1 && last != '\n' && ::write(log, "\n", 1) != 1)
      throw std::runtime_error("cannot append to --commit-log " + flags.commit_log + ": " + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{log};
  std::vector<int64_t> any_batch(static_cast<size_t>(flags.batch_size));
  std::iota(any_batch.begin(), any_batch.end(), 0);
  int64_t epoch = 0;
  double total = 0, seen = 0;
  auto epoch_start = Clock::now();
  while (true) {
    ft::Quorum view;
    try {
      view = manager->start_quorum();
    } catch (const ft::JobFinished&) {
      return 0;  // the manager said why; another group holds the trained model
    }
    // Where this step's samples start; every group of the quorum reads the same (its state is what
    // they committed), so they all end an epoch, and the training, on the same step.
    const ft::SamplerPosition position = sampler.position(*manager);
    const int64_t samples = sampler.step_samples(*manager);
    if (position.epoch != epoch) {
      // Only an epoch this process trained in: a group that healed into a later one trained none of
      // the epochs it skipped (their loss would read 0).
      if (seen > 0) {
        char line[256];
        std::snprintf(
            line, sizeof line, "replica group %d: epoch %lld/%d: loss %.4f (rank 0's samples), %.1fs, step %lld",
            manager->group(), static_cast<long long>(epoch + 1), flags.epochs, total / seen,
            std::chrono::duration<double>(Clock::now() - epoch_start).count(), static_cast<long long>(manager->step()));
        dist.print(line);
      }
      epoch = position.epoch;
      epoch_start = Clock::now();
      total = seen = 0;
    }
    if (epoch >= flags.epochs) break;
    const std::vector<int64_t> indices = sampler.indices(*manager);
    // A healing group trains on none of the step's samples: its gradients are replaced by its peers'
    // average, so any batch does for its forward and backward.
    const auto idx = torch::tensor(indices.empty() ? any_batch : indices, torch::kLong);
    model->train();
    const auto out = forward_batch<Impl>(ddp, rows(train.inputs, idx, device), rows(train.lengths, idx, device));
    const auto loss = classifier_loss(loss_kind, out, rows(train.labels, idx, device));
    loss.backward();
    if (manager->should_commit()) {
      opt.step();
      sampler.commit(*manager);
      if (!indices.empty()) {
        total += loss.template item<double>() * static_cast<double>(indices.size());
        seen += static_cast<double>(indices.size());
      }
      if (log >= 0) {
        const std::string line = nlohmann::json{{"step", manager->step()},
                                                {"group", manager->group()},
                                                {"rank", dist.rank()},
                                                {"pid", ::getpid()},
                                                {"quorum_id", view.quorum_id},
                                                {"groups", view.groups},
                                                {"healed", view.heal},
                                                {"participant_rank", view.participant_rank},
                                                {"epoch", position.epoch},
                                                {"first", position.cursor},
                                                {"samples", samples},
                                                {"indices", indices},
                                                {"hash", ft::parameters_digest(*model)}}
                                     .dump() +
                                 "\n";
        if (::write(log, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
          throw std::runtime_error("cannot append to --commit-log " + flags.commit_log + ": " + std::strerror(errno));
      }
    }
    opt.zero_grad();
  }
  const double accuracy = test_accuracy(*model, test, dist, device);
  char line[512];
  std::snprintf(line, sizeof line, "replica group %d: test accuracy: %.4f", manager->group(), accuracy);
  dist.print(line);
  dist.print(nlohmann::json{{"example", name},
                            {"fault_tolerant", true},
                            {"world_size", dist.world_size()},
                            {"device", device.str()},
                            {"epochs", flags.epochs},
                            {"test_accuracy", std::round(accuracy * 1e4) / 1e4},
                            {"replica_group", manager->group()},
                            {"committed_steps", manager->step()},
                            {"healed", manager->healed()}}
                 .dump());
  return 0;
}

}  // namespace ddprun::examples
