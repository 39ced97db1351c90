#pragma once
// Fault-tolerant replica groups for C++ workers (docs/fault-tolerance.md): the worker's side of
// ddprun --replica_group, as Python's ddprun_ft has it, on the same wire, so one job may mix C++
// and Python groups.
//
//   auto manager = std::make_shared<ft::Manager>(dist, ft::model_state(model, opt), ft::load_model_state(model, opt));
//   DistributedDataParallel ddp(model, dist, DdpOptions().find_unused_parameters(true));
//   ft::register_hook(ddp, manager);             // averaged over the group, then over the groups
//   while (manager->step() < steps) {
//     const ft::Quorum& q = manager->start_quorum();   // heals first when this group is behind
//     ... forward and backward on the batch of (manager->step(), q.replica_rank) ...
//     if (manager->should_commit()) opt.step();        // every rank of the group agrees
//     opt.zero_grad();
//   }
//
// The group's agent relays the quorum through the group's worker store (MASTER_ADDR:MASTER_PORT);
// the process group across the groups is a fresh Gloo group whenever the quorum id changes or a
// member's last step failed. A group behind the quorum's highest step fetches its peer rank's
// state (a torch.save file, the checkpoint layout {"model": ..., "optimizer": ...} when made with
// model_state) over HTTP, authenticated by a key only the quorum carries, and takes part in that
// step with zero gradients: it applies the average of the groups that were up to date, and is
// bit-identical to them once it steps.
//
// DDP must keep its first bucket layout (find_unused_parameters(true)): a restarted group's fresh
// buckets must hold the same parameters at the same offsets as its peers' (register_hook checks).
//
// start_quorum_async() instead of start_quorum() lets the forward run while the groups agree on
// the quorum (the first collective across the groups waits for it).
//
// Thread-safety: one training thread; allreduce_ may be called from DDP's hook threads.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/worker/ddp.hpp"
#include "ddprun/worker/distributed.hpp"

namespace ddprun::worker::ft {

struct ManagerOptions {
  // How long a quorum, a healing fetch and the collectives across the groups may take.
  TORCH_ARG(std::chrono::milliseconds, timeout){std::chrono::seconds(60)};
  // Ask for a quorum that only loses groups (torchft's shrink_only).
  TORCH_ARG(bool, shrink_only) = false;
};

// The quorum as this group sees it (the relay's answer; docs/fault-tolerance.md has the fields).
struct Quorum {
  int64_t seq = 0;
  int64_t quorum_id = 0;
  int replica_rank = 0;
  int replica_world_size = 1;
  int participants = 1;  // groups at max_step: their gradients count
  // This group's place among them (what splits a step's samples), -1 while it heals.
  int participant_rank = 0;
  int64_t max_step = 0;
  bool heal = false;
  int recover_from = -1;
  std::vector<std::string> recover_addresses;
  std::vector<int> serves;
  std::string store;
  std::vector<int> groups;
  bool reconfigure = false;
};

// start_quorum() found the job over: another replica group finished its training while this one
// was away (killed, frozen, started late), and no group is left to train with; its state is behind
// and there is nobody to heal from. Python's ddprun_ft.JobFinished. Catch it and return 0 from
// main (ddprun does not restart a group whose workers fail after being told, but says so).
class JobFinished : public std::runtime_error {
 public:
  JobFinished(const std::string& what, int64_t step, int group)
      : std::runtime_error(what), step_(step), group_(group) {}
  int64_t step() const { return step_; }  // the step the job finished at
  int group() const { return group_; }    // the group that finished it

 private:
  int64_t step_;
  int group_;
};

class Manager {
 public:
  using StateFn = std::function<c10::IValue()>;
  using LoadFn = std::function<void(const c10::IValue&)>;

  // `dist`: this worker's group (its rank and world are the group's). `state` gives what a healing
  // peer needs, `load` takes it. Throws std::invalid_argument outside a replica group (no
  // DDPRUN_REPLICA_GROUP: start it with ddprun --replica_group).
  Manager(const Distributed& dist, StateFn state, LoadFn load, const ManagerOptions& options = {});
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Asks for the next quorum and waits for it; heals this rank first when its group is behind.
  // Throws JobFinished when the job is over without this group, std::runtime_error when no quorum
  // can be had (the agent says why); a failure to heal or to build the group across the groups
  // makes this step's should_commit() false instead.
  const Quorum& start_quorum();
  // Asks for the next quorum and returns at once, so that the forward runs while the groups agree
  // (Python's start_quorum_async). The answer is waited for by the first collective across the
  // groups (DDP's hook, in the backward), by quorum() or by should_commit(), which throw what
  // start_quorum() would. A group behind the quorum's highest step trains that step with zero
  // gradients either way; it loads its peer's state in should_commit(), before the vote, never
  // while the backward runs. For loops whose batch does not depend on the quorum (Sampler's does:
  // it reads quorum(), so it waits there).
  void start_quorum_async();
  // Starts averaging `t` in place over the groups at the quorum's highest step (zeros from a
  // healing group); a future of it that never fails: a failure is remembered (no commit this
  // step). Every group must start its collectives in the same order (they match by order).
  c10::intrusive_ptr<c10::ivalue::Future> allreduce_async(at::Tensor t);
  // The same, waited for.
  void allreduce_(at::Tensor& t);
  // Something of this step failed: it will not be committed.
  void report_error(const std::string& what);
  // Every rank of the group votes (after healing, when this step's quorum says so); true when all
  // finished their step: step it, and step() counts. Throws what start_quorum() would when the
  // quorum was asked for with start_quorum_async() and not read yet.
  bool should_commit();

  int64_t step() const;
  int group() const;
  // This rank and the number of ranks in its group.
  int rank() const;
  int world_size() const;
  // Whether a quorum was asked for (start_quorum() or start_quorum_async()).
  bool has_quorum() const;
  // How many times this rank fetched its state from a peer.
  int healed() const;
  // The quorum of the step begun last; after start_quorum_async() it waits for the answer (and
  // throws what start_quorum() would).
  const Quorum& quorum() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Where a step's samples start: the epoch and the place in that epoch's permutation.
struct SamplerPosition {
  int64_t epoch = 0;
  int64_t cursor = 0;
};

// Which samples each rank trains on, following the committed steps: the twin of Python's
// ddprun_ft.Sampler (the same permutations, slices and state), so C++ and Python groups of one job
// draw the same batches. A cursor over a seeded permutation of the dataset (one per epoch,
// torch.randperm with a generator seeded with seed + epoch) that only commit() moves: each step the
// participants (the groups at the quorum's highest step) take consecutive slices of batch_size
// samples, group by group (participant_rank), rank by rank within a group; a healing group takes
// none. An epoch ends when the next step's samples would run past its end (its tail is left, as
// drop_last). Put state_dict() in the state a peer heals from (model_state(model, opt, &sampler)):
// no sample of a committed step is then trained twice or skipped after a failure. Every rank of
// every group must use the same length, batch_size and seed, and groups of the same size.
//
//   ft::Sampler sampler(train.size(), batch_size);
//   manager->start_quorum();
//   if (sampler.position(*manager).epoch >= epochs) break;   // every group ends on the same step
//   const auto idx = sampler.indices(*manager);               // empty while this group heals
//   ... if (manager->should_commit()) { opt.step(); sampler.commit(*manager); }
class Sampler {
 public:
  // Throws std::invalid_argument unless length and batch_size are above 0.
  Sampler(int64_t length, int64_t batch_size, uint64_t seed = 0);
  // How many samples the step manager.start_quorum() began trains on, over the groups.
  int64_t step_samples(const Manager& manager) const;
  // Where this step's samples start: the next epoch's start when the step would run past the end of
  // the current one. Throws std::invalid_argument when one step takes more samples than there are.
  SamplerPosition position(const Manager& manager) const;
  // This rank's samples for the step manager.start_quorum() began; empty while its group heals.
  // Throws std::logic_error before the first start_quorum().
  std::vector<int64_t> indices(const Manager& manager);
  // The step was committed (should_commit() said true): the cursor moves past it.
  void commit(const Manager& manager);
  // {"epoch": int, "cursor": int}, as Python's Sampler.state_dict().
  c10::IValue state_dict() const;
  void load_state_dict(const c10::IValue& state);
  SamplerPosition committed() const { return {epoch_, cursor_}; }

 private:
  int64_t length_;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;
  int64_t order_epoch_ = -1;
  at::Tensor order_;  // the permutation of order_epoch_
};

namespace detail {
using Hook = std::function<comm_hooks::TensorFuture(c10d::GradBucket&)>;
// The hook of register_hook for a DDP whose logging data is `ddp_data` and whose gradients are
// reduced on `group`.
Hook allreduce_hook(const c10::DDPLoggingData& ddp_data, c10::intrusive_ptr<c10d::ProcessGroup> group,
                    std::shared_ptr<Manager> manager);
}  // namespace detail

// Python's ddprun_ft.allreduce_hook on a ddprun DDP: each bucket summed over the group and divided
// by its size (Python's order of operations), then averaged across the groups by `manager`.
// Throws std::invalid_argument for a DDP without find_unused_parameters(true).
template <typename ModuleType>
void register_hook(DistributedDataParallel<ModuleType>& ddp, std::shared_ptr<Manager> manager) {
  ddp.register_comm_hook(
      detail::allreduce_hook(ddp.logging_data(), ddp.process_group(), std::move(manager)),
      [](detail::Hook& hook, c10d::GradBucket& bucket) { return hook(bucket); }, "ddprun_ft.allreduce_hook");
}

// The first 16 hex digits of the SHA-256 of the module's parameters' bytes, in parameters() order
// (copied to the host first): Python's hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes()
// for p in model.parameters())).hexdigest()[:16]. Equal in every group that committed a step, so
// commit logs can be compared across groups and languages.
std::string parameters_digest(const torch::nn::Module& model);

// {"model": model.state_dict(), "optimizer": optimizer.state_dict()} and the way back: the layout
// of ddprun's checkpoints and of Python's ddprun_ft workers that use the same keys. With a
// sampler, "sampler": sampler.state_dict() too (as examples/python/fashion_mnist_ddp.py has it).
// Each keeps a reference to what it is given: they must outlive the Manager.
Manager::StateFn model_state(torch::nn::Module& model, torch::optim::Optimizer& optimizer, Sampler* sampler = nullptr);
Manager::LoadFn load_model_state(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                 Sampler* sampler = nullptr);

}  // namespace ddprun::worker::ft
