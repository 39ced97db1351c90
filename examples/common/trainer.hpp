#pragma once
// The data-parallel training loop every example shares: DDP-wrapped model, RankSampler with
// set_epoch, per-rank batches, SGD with momentum, loss and accuracy reduced over all ranks, rank-0
// printing, a checkpoint per epoch, resume, a sharded test evaluation, and a final JSON line:
//   {"example": ..., "world_size": ..., "epochs": ..., "first_loss": ..., "final_loss": ...,
//    "test_accuracy": ..., "samples_per_s": ..., "seconds": ...}

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/fashion_mnist.hpp"
#include "common/flags.hpp"
#include "common/progress.hpp"
#include "ddprun/worker.hpp"

namespace ddprun::examples {

enum class Loss { CrossEntropy, NllOfLogSoftmax };

// Models of variable-length sequences take (inputs, lengths); the others take inputs alone.
template <typename Impl, typename Fn>
torch::Tensor forward_batch(Fn&& forward, const torch::Tensor& x, const torch::Tensor& lengths) {
  if constexpr (requires(Impl & m) { m.forward(x, lengths); }) {
    return forward(x, lengths);
  } else {
    return forward(x);
  }
}

inline torch::Tensor rows(const torch::Tensor& t, const torch::Tensor& index, torch::Device device) {
  return t.defined() ? t.index_select(0, index).to(device) : torch::Tensor();
}

inline torch::Tensor classifier_loss(Loss kind, const torch::Tensor& out, const torch::Tensor& y) {
  return kind == Loss::CrossEntropy ? torch::nn::functional::cross_entropy(out, y)
                                    : torch::nn::functional::nll_loss(out, y);
}

// Test accuracy: each rank scores a contiguous shard of `test`; the counts are summed over `dist`.
template <typename Impl>
double test_accuracy(Impl& model, const Dataset& test, worker::Distributed& dist, torch::Device device) {
  model.eval();
  torch::NoGradGuard no_grad;
  const int64_t total = test.size();
  const int64_t begin = total * dist.rank() / dist.world_size(), end = total * (dist.rank() + 1) / dist.world_size();
  double right = 0;
  for (int64_t at = begin; at < end; at += 512) {
    const auto idx = torch::arange(at, std::min<int64_t>(at + 512, end), torch::kLong);
    const auto out = forward_batch<Impl>([&](auto&&... a) { return model.forward(a...); },
                                         rows(test.inputs, idx, device), rows(test.lengths, idx, device));
    right += out.argmax(1).eq(rows(test.labels, idx, device)).sum().template item<double>();
  }
  return dist.sum(right) / static_cast<double>(std::max<int64_t>(total, 1));
}

template <typename Impl>
int train_classifier(const std::string& name, const ExampleFlags& flags, std::shared_ptr<Impl> model,
                     const Dataset& train, const Dataset& test, Loss loss_kind) {
  using Clock = std::chrono::steady_clock;
  auto dist = worker::Distributed::init();
  const auto device = dist.device();
  model->to(device);
  if (flags.sync_bn && worker::set_sync_batch_norm_group(*model, dist.c10d_group()) == 0) {
    std::fprintf(stderr, "%s: --sync-bn: this model has no batch norm (SyncBatchNorm) to synchronise\n", name.c_str());
    return 2;
  }
  worker::DistributedDataParallel<Impl> ddp(model, dist);
  if (flags.powersgd_rank > 0) {
    const auto powersgd = worker::comm_hooks::PowerSGDOptions()
                              .matrix_approximation_rank(flags.powersgd_rank)
                              .start_powerSGD_iter(kPowerSgdStartIter);
    ddp.register_comm_hook(std::make_shared<worker::comm_hooks::PowerSGDState>(ddp.process_group(), powersgd),
                           worker::comm_hooks::powerSGD_hook, "powerSGD_hook");
  } else if (!flags.comm_hook.empty()) {
    ddp.register_comm_hook(worker::comm_hooks::parse_builtin(flags.comm_hook));
  }
  // With --zero each rank's SGD holds its shard's momentum; `opt` then steps nothing.
  const auto sgd = torch::optim::SGDOptions(flags.lr).momentum(0.9);
  std::unique_ptr<worker::ZeroRedundancyOptimizer<torch::optim::SGD>> zero;
  if (flags.zero)
    zero =
        std::make_unique<worker::ZeroRedundancyOptimizer<torch::optim::SGD>>(ddp.parameters(), sgd, dist.c10d_group());
  torch::optim::SGD opt(flags.zero ? std::vector<torch::Tensor>{} : ddp.parameters(), sgd);
  const std::string ckpt = flags.checkpoint_dir.empty() ? "" : flags.checkpoint_dir + "/checkpoint.pt";
  // With --zero, epoch E's consolidated optimizer state is checkpoint.pt.zero.E beside the
  // checkpoint: written before the checkpoint that names epoch E, the older one removed after it,
  // so a crash between the two writes leaves the previous checkpoint with its own state (never
  // one epoch's model with another's momentum).
  const auto zero_ckpt = [&ckpt](int64_t epoch) { return ckpt + ".zero." + std::to_string(epoch); };
  int start_epoch = 0;
  // After a restart, and after the job re-formed without a node or with a new one (a spare in a
  // lost node's place, a crashed node's rerun): the same job goes on from its checkpoint.
  if (!ckpt.empty() && (flags.resume || dist.env().restart_count > 0 || dist.env().round > 0)) {
    if (auto done = worker::load_checkpoint(ckpt, *model, &opt)) {
      start_epoch = static_cast<int>(*done) + 1;
      if (zero) {
        if (!std::filesystem::exists(zero_ckpt(*done))) {
          throw std::runtime_error(ckpt + " is epoch " + std::to_string(*done + 1) + "'s, and its optimizer state " +
                                   zero_ckpt(*done) +
                                   " is missing: resume without --zero, or from a checkpoint "
                                   "directory that has both");
        }
        zero->load(zero_ckpt(*done));
      }
      dist.print("resumed from ", ckpt, " after epoch ", *done + 1);
    }
  }
  worker::RankSampler sampler(train.size(), dist, worker::SamplerOptions().seed(flags.seed));
  dist.print(name, ": ", train.size(), " training samples, ", dist.world_size(), " worker(s) x batch ",
             flags.batch_size, " (global batch ", flags.batch_size * dist.world_size(), "), lr ", flags.lr);
  double first_loss = -1, final_loss = 0, total_seconds = 0, total_samples = 0;
  for (int epoch = start_epoch; epoch < flags.epochs; ++epoch) {
    model->train();
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    const auto indices = torch::tensor(sampler.indices(), torch::kLong);
    const int64_t n = indices.size(0);
    double loss_sum = 0, correct = 0, seen = 0;
    const auto t0 = Clock::now();
    int64_t step = 0;
    const int64_t steps = (n + flags.batch_size - 1) / flags.batch_size;
    const int64_t epoch_steps = flags.max_steps > 0 ? std::min(steps, flags.max_steps) : steps;
    EpochProgress progress(flags.progress && dist.rank() == 0, epoch, flags.epochs, epoch_steps);
    for (int64_t at = 0; at < n; at += flags.batch_size, ++step) {
      if (flags.max_steps > 0 && step >= flags.max_steps) break;
      progress.update(step);
      const auto idx = indices.narrow(0, at, std::min<int64_t>(flags.batch_size, n - at));
      const auto x = rows(train.inputs, idx, device), y = rows(train.labels, idx, device);
      zero ? zero->zero_grad(false) : opt.zero_grad();
      const auto out = forward_batch<Impl>(ddp, x, rows(train.lengths, idx, device));
      const auto loss = classifier_loss(loss_kind, out, y);
      loss.backward();
      zero ? zero->step() : static_cast<void>(opt.step());
      // Steps completed in the whole run, resumed epochs included: ddprun's restart policy stops a
      // job whose restarts no longer get further (--max_no_progress_restarts).
      const int64_t completed = epoch * epoch_steps + step + 1;
      worker::report_iterations(static_cast<uint64_t>(completed));
      if (completed == flags.crash_at_step && dist.rank() == 0) {
        std::fprintf(stderr, "--crash-at-step %lld: rank 0 exits with status 1 (fault injection)\n",
                     static_cast<long long>(completed));
        std::fflush(stderr);
        std::_Exit(1);
      }
      loss_sum += loss.template item<double>() * static_cast<double>(y.size(0));
      correct += out.argmax(1).eq(y).sum().template item<double>();
      seen += static_cast<double>(y.size(0));
    }
    progress.finish();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const double global_seen = dist.sum(seen);
    const double epoch_loss = dist.sum(loss_sum) / global_seen;
    const double train_acc = dist.sum(correct) / global_seen;
    const double slowest = dist.max(seconds);
    if (first_loss < 0) first_loss = epoch_loss;
    final_loss = epoch_loss;
    total_seconds += slowest;
    total_samples += global_seen;
    char line[256];
    std::snprintf(line, sizeof line, "epoch %d/%d: loss %.4f, train accuracy %.4f, %.1fs, %.0f samples/s", epoch + 1,
                  flags.epochs, epoch_loss, train_acc, slowest, global_seen / slowest);
    dist.print(line);
    if (!ckpt.empty()) {
      if (zero) {
        zero->consolidate_state_dict(0);
        if (dist.rank() == 0) zero->save(zero_ckpt(epoch));
      }
      worker::save_checkpoint(ckpt, *model, &opt, epoch, dist);
      if (zero && dist.rank() == 0 && epoch > 0) std::filesystem::remove(zero_ckpt(epoch - 1));
    }
  }

  const double accuracy = test_accuracy(*model, test, dist, device);
  char json[512];
  std::snprintf(json, sizeof json,
                "{\"example\": \"%s\", \"world_size\": %d, \"epochs\": %d, \"batch_size_per_rank\": %d, "
                "\"first_loss\": %.5f, \"final_loss\": %.5f, \"test_accuracy\": %.4f, \"samples_per_s\": %.1f, "
                "\"seconds\": %.2f, \"comm_hook\": \"%s\", \"sync_bn\": %s, \"zero\": %s}",
                name.c_str(), dist.world_size(), flags.epochs, flags.batch_size, first_loss, final_loss, accuracy,
                total_seconds > 0 ? total_samples / total_seconds : 0.0, total_seconds,
                flags.comm_hook.empty() ? "none" : flags.comm_hook.c_str(), flags.sync_bn ? "true" : "false",
                flags.zero ? "true" : "false");
  dist.print("test accuracy: ", accuracy);
  dist.print(json);
  return 0;
}

}  // namespace ddprun::examples
