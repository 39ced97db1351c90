// torch/distributed/algorithms/join.py's Join, collective for collective.
#include "ddprun/worker/join.hpp"

#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>

#include "ddprun/worker/progress.hpp"

namespace ddprun::worker {
namespace {

constexpr int kSkewWarning = 1000;  // Python's WARN_THRESHOLD

c10::intrusive_ptr<c10d::Work> all_reduce(c10d::ProcessGroup& group, at::Tensor& t) {
  std::vector<at::Tensor> tensors{t};
  return group.allreduce(tensors);
}

}  // namespace

Join::Join(std::vector<std::reference_wrapper<Joinable>> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options), uncaught_at_start_(std::uncaught_exceptions()) {
  if (joinables_.empty()) throw std::invalid_argument("Join: the join context manager requires at least one joinable");
  for (Joinable& j : joinables_) hooks_.push_back(j.join_hook(options_));
  bool first = true;
  for (Joinable& j : joinables_) {
    j.join_config_ = JoinConfig{options_.enable(), options_.throw_on_early_termination(), first};
    first = false;
  }
  // Python requires one process group; here DDP's (its direct Gloo path) and a ZeRO optimizer's
  // (the job's group) are different objects over the same ranks, which is what matters.
  for (Joinable& j : joinables_) {
    auto group = j.join_process_group();
    if (!group) throw std::invalid_argument("Join: a joinable has no process group");
    if (!process_group_) {
      process_group_ = group;
      device_ = j.join_device();
    } else if (group->getRank() != process_group_->getRank() || group->getSize() != process_group_->getSize()) {
      throw std::invalid_argument("Join: the joinables' process groups differ (rank " +
                                  std::to_string(group->getRank()) + " of " + std::to_string(group->getSize()) +
                                  " vs rank " + std::to_string(process_group_->getRank()) + " of " +
                                  std::to_string(process_group_->getSize()) + "): use one group for all of them");
    }
  }
}

Join::~Join() {
  if (finished_ || !options_.enable() || std::uncaught_exceptions() > uncaught_at_start_) return;
  try {
    finish();
  } catch (const std::exception& e) {
    std::cerr << "ddprun worker: Join::finish() failed in ~Join (call finish() or run() to handle it): " << e.what()
              << std::endl;
    std::terminate();
  }
}

double Join::all_reduce_one(double value) {
  auto t = torch::full({1}, value, torch::TensorOptions().device(device_));
  CollectiveWait waiting;
  all_reduce(*process_group_, t)->wait();
  return t.item<double>();
}

void Join::finish() {
  if (finished_) return;
  finished_ = true;
  if (!options_.enable()) return;
  bool is_last_joiner = true;
  for (int i = 0;; ++i) {
    if (i == kSkewWarning + 1) {
      std::cerr << "ddprun worker: Detected uneven input skew of greater than " << kSkewWarning
                << ". This means that rank " << process_group_->getRank() << " has at least " << kSkewWarning
                << " fewer inputs than other currently-active ranks. This level of skew could lead to performance "
                   "degradation during training."
                << std::endl;
    }
    // Matches the notifying all-reduce of the ranks still training.
    if (all_reduce_one(0) == 0) break;
    if (options_.throw_on_early_termination()) {
      all_reduce_one(1);  // matches their check, which then throws
      throw std::runtime_error("Rank " + std::to_string(process_group_->getRank()) + " exhausted all inputs.");
    }
    for (auto& hook : hooks_) hook->main_hook();
    is_last_joiner = false;
  }
  for (auto& hook : hooks_) hook->post_hook(is_last_joiner);
}

c10::intrusive_ptr<c10d::Work> Join::notify_join_context(Joinable& joinable) {
  const JoinConfig& config = joinable.join_config();
  if (!config.is_first_joinable || !config.enable) return {};
  auto group = joinable.join_process_group();
  const auto options = torch::TensorOptions().device(joinable.join_device());
  auto ones = torch::ones({1}, options);
  auto work = all_reduce(*group, ones);
  if (config.throw_on_early_termination) {
    auto zeros = torch::zeros({1}, options);
    {
      CollectiveWait waiting;
      all_reduce(*group, zeros)->wait();
    }
    if (zeros.item<double>() != 0) {
      throw std::runtime_error("Detected at least one rank that exhausted inputs. Throwing across all ranks.");
    }
  }
  return work;
}

}  // namespace ddprun::worker
