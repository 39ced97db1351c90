#pragma once
// Training on uneven inputs: torch/distributed/algorithms/join.py's Join, JoinHook and Joinable.
//
// Ranks that run out of batches before the others "join": at the end of the block each of them
// shadows, iteration by iteration, the collectives the ranks still training launch (a DDP
// forward's notification and buffer broadcast, its backward's bucket all-reduces with zero
// gradients, a ZeRO step's broadcasts), so nobody hangs, until every rank has joined; then every
// joinable's post hook runs (DDP: the model of the last rank to join is broadcast to all).
//
//   ddp.join([&] {                       // Python: with ddp.join():
//     for (auto& batch : my_batches) { ... forward, backward, step ... }
//   });
//   Join({ddp, zero}, options).run(...)  // Python: with Join([ddp, zero]):
//
// Each iteration, the first joinable's notify_join_context (DDP's forward, ZeRO's step) all-reduces
// a 1 for the ranks still in; a joined rank's loop all-reduces a 0, so everyone learns how many
// ranks are still training. With divide_by_initial_world_size false, DDP divides the gradients by
// that number rather than the world size. With throw_on_early_termination, the first rank to run
// out throws "Rank R exhausted all inputs." from the end of its block and every other rank throws
// "Detected at least one rank that exhausted inputs. Throwing across all ranks." from its next
// forward: catch it on every rank (needed when the model runs collectives of its own, e.g.
// SyncBatchNorm, which the join hooks cannot shadow).
//
// As in Python, the joinables keep the configuration after the block: their forwards and steps
// still notify (one small all-reduce each, on every rank alike) until a Join with enable = false
// replaces it.

#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

namespace ddprun::worker {

// Set as LibTorch's options are: JoinOptions().throw_on_early_termination(true).
struct JoinOptions {
  // false: the block runs as written (for inputs known to be even), no collective added.
  TORCH_ARG(bool, enable) = true;
  // Throw on every rank once one rank runs out of inputs (divide_by_initial_world_size then has no
  // effect).
  TORCH_ARG(bool, throw_on_early_termination) = false;
  // DDP's join hook: divide the gradients by the world size the job started with (true), or by
  // the number of ranks not yet joined (false: the remaining ranks' samples weigh more).
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
};

// What a joinable does once its rank has joined (Python's JoinHook).
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Called repeatedly while some rank has not joined: shadows one iteration's collectives.
  virtual void main_hook() {}
  // Called once every rank has joined; is_last_joiner: this rank is one of the last to join.
  virtual void post_hook(bool is_last_joiner) {}
};

// The state Join gives each joinable (Python's _JoinConfig).
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;
};

// A class whose per-iteration collectives a Join can shadow (Python's Joinable): it calls
// Join::notify_join_context(*this) before them each iteration.
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  // Where Join's own all-reduces run: the device, and the process group every joinable shares.
  virtual torch::Device join_device() const = 0;
  virtual c10::intrusive_ptr<c10d::ProcessGroup> join_process_group() const = 0;
  const JoinConfig& join_config() const { return join_config_; }

 protected:
  Joinable() = default;
  Joinable(const Joinable&) = default;
  Joinable& operator=(const Joinable&) = default;

 private:
  friend class Join;
  JoinConfig join_config_;
};

class Join {
 public:
  // Python's Join(joinables, enable, throw_on_early_termination, **kwargs): asks each joinable for
  // its hook and gives each its configuration (the first one does the notifying). Throws
  // std::invalid_argument for no joinables, or joinables whose process groups differ in rank or size.
  Join(std::vector<std::reference_wrapper<Joinable>> joinables, JoinOptions options = {});
  // Runs finish() if the block neither finished nor is being left by an exception (an error there
  // ends the process: call finish() or run() to see it).
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // The end of the block (Python's __exit__ without an exception): shadows the other ranks'
  // iterations until every rank has joined, then runs the post hooks. Collective. With
  // throw_on_early_termination, throws std::runtime_error on the rank whose inputs ran out first.
  void finish();

  // body(), then finish(); an exception from body() leaves at once, as Python's with block does.
  template <typename Body>
  void run(Body&& body) {
    try {
      std::forward<Body>(body)();
    } catch (...) {
      finished_ = true;
      throw;
    }
    finish();
  }

  // Called by a joinable before its per-iteration collectives: when it is the first joinable of
  // an enabled Join, all-reduces a 1 (the returned work: the number of ranks not joined) and, with
  // throw_on_early_termination, throws when another rank has run out. Otherwise returns null.
  static c10::intrusive_ptr<c10d::Work> notify_join_context(Joinable& joinable);

 private:
  double all_reduce_one(double value);

  std::vector<std::reference_wrapper<Joinable>> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  JoinOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroup> process_group_;
  torch::Device device_{torch::kCPU};
  int uncaught_at_start_ = 0;
  bool finished_ = false;
};

}  // namespace ddprun::worker
