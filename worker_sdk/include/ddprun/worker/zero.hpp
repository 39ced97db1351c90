#pragma once
// ZeroRedundancyOptimizer: the optimizer's state sharded over the ranks, as Python's
// torch/distributed/optim/zero_redundancy_optimizer.py does it (ZeRO stage 1).
//
// The parameters are partitioned by Python's rule: largest first (a stable sort by size), each to
// the rank with the fewest elements so far. Each rank's optimizer (Optim, constructed over its own
// shard) keeps the state of that shard only; step() steps it, then every parameter is broadcast
// from its owner, rank by rank in partition order, so every rank ends with the parameters a
// local optimizer over all of them would give, bit for bit (the optimizers here update each
// parameter from its own gradient and state alone). Gradients must be the averaged ones (DDP's).
//
// Checkpoints: consolidate_state_dict(to) gathers every shard's state on rank `to`, which
// save()s it by the parameters' global indices; load() on any number of ranks installs the state
// of the parameters each rank owns then, so a checkpoint made at 4 ranks resumes at 2.
//
// Joinable (join.hpp): in a Join, a rank that has run out of inputs keeps stepping (its own shard,
// from the gradients it has) and broadcasting while the others train, as Python's ZeRO join hook
// does.
//
// Optim is one of torch::optim::SGD, Adam, AdamW, RMSprop and Adagrad (zero_traits below).

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/optim.h>
#include <torch/serialize.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/worker/join.hpp"
#include "ddprun/worker/serialize.hpp"

namespace ddprun::worker {

template <typename Optim>
struct zero_traits;
// LibTorch names each optimizer's options NameOptions and its per-parameter state NameParamState.
#define DDPRUN_ZERO_TRAITS(NAME)                  \
  template <>                                     \
  struct zero_traits<torch::optim::NAME> {        \
    using Options = torch::optim::NAME##Options;  \
    using State = torch::optim::NAME##ParamState; \
  };
DDPRUN_ZERO_TRAITS(SGD)
DDPRUN_ZERO_TRAITS(Adam)
DDPRUN_ZERO_TRAITS(AdamW)
DDPRUN_ZERO_TRAITS(RMSprop)
DDPRUN_ZERO_TRAITS(Adagrad)
#undef DDPRUN_ZERO_TRAITS

// Python's partition: for each parameter (by its number of elements), the rank that owns it.
inline std::vector<int> zero_partition(const std::vector<int64_t>& numels, int world_size) {
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<int64_t> sizes(static_cast<size_t>(world_size), 0);
  std::vector<int> owner(numels.size(), 0);
  for (size_t i : order) {
    const auto least = static_cast<size_t>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
    owner[i] = static_cast<int>(least);
    sizes[least] += numels[i];
  }
  return owner;
}

template <typename Optim>
class ZeroRedundancyOptimizer : public Joinable {
 public:
  using Options = typename zero_traits<Optim>::Options;
  using State = typename zero_traits<Optim>::State;

  // `params` in the same order on every rank (e.g. DistributedDataParallel::parameters()).
  ZeroRedundancyOptimizer(std::vector<torch::Tensor> params, const Options& options,
                          c10::intrusive_ptr<c10d::ProcessGroup> process_group)
      : params_(std::move(params)), group_(std::move(process_group)) {
    if (!group_) throw std::invalid_argument("ZeroRedundancyOptimizer: process_group is null");
    if (params_.empty()) throw std::invalid_argument("ZeroRedundancyOptimizer: no parameters");
    std::vector<int64_t> numels;
    for (const auto& p : params_) numels.push_back(p.numel());
    owner_ = zero_partition(numels, group_->getSize());
    // Python's shards list each rank's parameters largest first; the broadcasts follow that order.
    shards_.resize(static_cast<size_t>(group_->getSize()));
    std::vector<size_t> order(params_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
    for (size_t i : order) shards_[static_cast<size_t>(owner_[i])].push_back(i);
    std::vector<torch::Tensor> mine;
    for (size_t i : shards_[static_cast<size_t>(group_->getRank())]) mine.push_back(params_[i]);
    // A rank may own nothing (more ranks than parameters): its optimizer steps no parameter.
    local_ = std::make_unique<Optim>(mine, options);
    // step()'s broadcasts: each rank's shard, parameters of another dtype or device apart.
    for (int rank = 0; rank < group_->getSize(); ++rank) {
      for (size_t i : shards_[static_cast<size_t>(rank)]) {
        auto it = std::find_if(broadcasts_.begin(), broadcasts_.end(), [&](const Broadcast& b) {
          const auto& first = params_[b.members.front()];
          return b.root == rank && first.scalar_type() == params_[i].scalar_type() &&
                 first.device() == params_[i].device();
        });
        if (it == broadcasts_.end()) it = broadcasts_.insert(broadcasts_.end(), Broadcast{rank, {}, 0});
        it->members.push_back(i);
        it->numel += params_[i].numel();
      }
    }
  }

  // Joinable: once joined, a rank steps on each iteration of the others (Python's _ZeROJoinHook).
  std::unique_ptr<JoinHook> join_hook(const JoinOptions&) override {
    struct Hook final : JoinHook {
      explicit Hook(ZeroRedundancyOptimizer& z) : zero(z) {}
      void main_hook() override { zero.step(); }
      ZeroRedundancyOptimizer& zero;
    };
    return std::make_unique<Hook>(*this);
  }
  torch::Device join_device() const override { return params_.front().device(); }
  c10::intrusive_ptr<c10d::ProcessGroup> join_process_group() const override { return group_; }

  // Steps this rank's shard, then brings every rank's shard to every rank: one broadcast per rank
  // of its shard flattened (as Python's parameters_as_bucket_view does), not one per parameter.
  void step() {
    Join::notify_join_context(*this);
    local_->step();
    const int me = group_->getRank();
    std::vector<at::Tensor> buffers;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (const Broadcast& b : broadcasts_) {
      if (b.root == me) {
        std::vector<at::Tensor> parts;
        for (size_t i : b.members) parts.push_back(params_[i].detach().reshape(-1));
        buffers.push_back(at::cat(parts));
      } else {
        buffers.push_back(at::empty({b.numel}, params_[b.members.front()].options().requires_grad(false)));
      }
      std::vector<at::Tensor> tensor{buffers.back()};
      c10d::BroadcastOptions options;
      options.rootRank = b.root;
      works.push_back(group_->broadcast(tensor, options));
    }
    for (auto& w : works) w->wait();
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < broadcasts_.size(); ++k) {
      if (broadcasts_[k].root == me) continue;
      int64_t offset = 0;
      for (size_t i : broadcasts_[k].members) {
        const int64_t n = params_[i].numel();
        params_[i].detach().copy_(buffers[k].narrow(0, offset, n).view_as(params_[i]));
        offset += n;
      }
    }
  }

  // Every parameter's gradient, not only the shard's (Python's zero_grad covers all of them).
  void zero_grad(bool set_to_none = true) {
    for (auto& p : params_) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.mutable_grad() = torch::Tensor();
      } else {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
  }

  Optim& local_optimizer() { return *local_; }
  // The rank that owns parameter i, and the indices each rank owns (largest first).
  int owner(size_t i) const { return owner_.at(i); }
  const std::vector<std::vector<size_t>>& shards() const { return shards_; }
  // Bytes of this rank's optimizer state tensors.
  int64_t local_state_bytes() const {
    int64_t bytes = 0;
    for (size_t i : shards_[static_cast<size_t>(group_->getRank())]) {
      auto it = local_->state().find(key(params_[i]));
      if (it == local_->state().end()) continue;
      torch::serialize::OutputArchive archive;
      it->second->serialize(archive);
      std::ostringstream out;
      archive.save_to(out);
      bytes += static_cast<int64_t>(out.str().size());
    }
    return bytes;
  }

  // Gathers every shard's state on rank `to` (every rank must call it); then save() there.
  void consolidate_state_dict(int to = 0) {
    consolidated_.clear();
    const int me = group_->getRank();
    for (int rank = 0; rank < group_->getSize(); ++rank) {
      std::string bytes;
      if (rank == me) bytes = shard_bytes();
      // The shard's size, then its bytes, from its owner.
      auto size = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kLong);
      broadcast(size, rank);
      auto data = torch::empty({size.item<int64_t>()}, torch::kUInt8);
      if (rank == me) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
      if (data.numel() > 0) broadcast(data, rank);
      if (me == to) consolidated_.emplace_back(static_cast<const char*>(data.data_ptr()), data.numel());
    }
  }

  // On the rank consolidate_state_dict gathered on: the whole state to `path`, as every file of the
  // SDK is written: a torch.save file ({"numels": [...], "shards": [one uint8 tensor per rank]}),
  // replaced durably (a crash leaves the previous file whole) and not at all by a node whose place
  // in the job lapsed (worker::torch_save).
  void save(const std::string& path) const {
    if (consolidated_.empty()) {
      throw std::logic_error(
          "ZeroRedundancyOptimizer::save: call consolidate_state_dict(to) first, on every rank, "
          "and save on rank `to`");
    }
    std::vector<int64_t> numels;
    for (const auto& p : params_) numels.push_back(p.numel());
    c10::impl::GenericList shards(c10::TensorType::get());
    for (const auto& bytes : consolidated_) {
      shards.push_back(
          torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())}, torch::kUInt8)
              .clone());
    }
    c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
    state.insert("numels", torch::tensor(numels, torch::kLong));
    state.insert("shards", shards);
    torch_save(state, path);
  }

  // On every rank, at any world size: installs the saved state of the parameters this rank owns.
  void load(const std::string& path) {
    // A torch.save file (save() above); one an earlier release wrote is a LibTorch archive.
    std::vector<torch::Tensor> shards;
    torch::Tensor numels;
    c10::IValue saved;
    bool torch_save_file = true;
    try {
      saved = torch_load(path);
    } catch (const std::exception&) {
      torch_save_file = false;
    }
    if (torch_save_file) {
      if (!saved.isGenericDict() || !saved.toGenericDict().contains("numels") ||
          !saved.toGenericDict().contains("shards")) {
        throw std::invalid_argument("ZeroRedundancyOptimizer::load: " + path +
                                    " is a torch.save file but not a ZeRO state (no numels and shards)");
      }
      const auto dict = saved.toGenericDict();
      numels = dict.at("numels").toTensor();
      const c10::IValue saved_shards = dict.at("shards");
      for (const auto& shard : saved_shards.toListRef()) shards.push_back(shard.toTensor().contiguous());
    } else {
      torch::serialize::InputArchive archive;
      archive.load_from(path);
      archive.read("numels", numels);
      for (int64_t rank = 0;; ++rank) {
        torch::Tensor shard;
        if (!archive.try_read("shard/" + std::to_string(rank), shard)) break;
        shards.push_back(shard);
      }
    }
    if (numels.numel() != static_cast<int64_t>(params_.size())) {
      throw std::invalid_argument("ZeroRedundancyOptimizer::load: " + path + " holds the state of " +
                                  std::to_string(numels.numel()) + " parameters, this optimizer has " +
                                  std::to_string(params_.size()));
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (numels[static_cast<int64_t>(i)].item<int64_t>() != params_[i].numel()) {
        throw std::invalid_argument("ZeroRedundancyOptimizer::load: parameter " + std::to_string(i) + " of " + path +
                                    " has " + std::to_string(numels[static_cast<int64_t>(i)].item<int64_t>()) +
                                    " elements, this optimizer's " + std::to_string(params_[i].numel()));
      }
    }
    const int me = group_->getRank();
    for (const torch::Tensor& shard : shards) {
      std::istringstream in(
          std::string(static_cast<const char*>(shard.data_ptr()), static_cast<size_t>(shard.numel())));
      torch::serialize::InputArchive shard_archive;
      shard_archive.load_from(in);
      for (size_t i = 0; i < params_.size(); ++i) {
        if (owner_[i] != me) continue;
        torch::serialize::InputArchive state_archive;
        if (!shard_archive.try_read("param/" + std::to_string(i), state_archive)) continue;
        auto state = std::make_unique<State>();
        state->serialize(state_archive);
        local_->state()[key(params_[i])] = std::move(state);
      }
    }
  }

 private:
#if TORCH_VERSION_MAJOR >= 2
  static void* key(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
  static std::string key(const torch::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }
#endif

  // This rank's states, by the parameters' global indices.
  std::string shard_bytes() const {
    torch::serialize::OutputArchive archive;
    for (size_t i : shards_[static_cast<size_t>(group_->getRank())]) {
      auto it = local_->state().find(key(params_[i]));
      if (it == local_->state().end()) continue;
      torch::serialize::OutputArchive state;
      it->second->serialize(state);
      archive.write("param/" + std::to_string(i), state);
    }
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  }

  void broadcast(torch::Tensor& t, int root) {
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group_->broadcast(tensors, options)->wait();
  }

  std::vector<torch::Tensor> params_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<int> owner_;
  std::vector<std::vector<size_t>> shards_;
  struct Broadcast {
    int root;
    std::vector<size_t> members;  // parameter indices, in shard order
    int64_t numel;
  };
  std::vector<Broadcast> broadcasts_;
  std::unique_ptr<Optim> local_;
  std::vector<std::string> consolidated_;
};

}  // namespace ddprun::worker
