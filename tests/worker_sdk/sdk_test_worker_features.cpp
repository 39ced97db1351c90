// sdk_test_worker's modes for DDP as a module and for what DDP users add to DDP: communication
// hooks (a user's and PowerSGD), SyncBatchNorm and ZeroRedundancyOptimizer (see sdk_test_worker.cpp
// for the modes).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sdk_test_worker.hpp"

namespace ddprun::test::sdk_worker {

// DDP as a module, as Python's is: a child of another module (made with make_shared, used with
// `->`), whose parameters, train()/eval() and state dict ("module."-prefixed names) go through it;
// saved with torch::save from one DDP and loaded with torch::load into another; training through
// the parent reduces the gradients.
struct TrainerImpl : torch::nn::Module {
  explicit TrainerImpl(std::shared_ptr<DistributedDataParallel<NetImpl>> d) {
    ddp = register_module("ddp", std::move(d));
  }
  torch::Tensor forward(const torch::Tensor& x) { return ddp->forward(x); }
  std::shared_ptr<DistributedDataParallel<NetImpl>> ddp;
};
TORCH_MODULE(Trainer);

int ddp_module(const std::string& dir) {
  auto dist = Distributed::init();
  const int world = dist.world_size(), per_rank = 4;
  Net model = rank_seeded_net(dist.rank());
  Trainer trainer(std::make_shared<DistributedDataParallel<NetImpl>>(model.ptr(), dist, small_buckets()));
  int name_mismatches = 0;
  const auto names = state_dict(*trainer->ddp), inner = state_dict(*model);
  for (const auto& entry : inner) {
    if (entry.key().toStringRef() != "_metadata" && !names.contains("module." + entry.key().toStringRef())) {
      ++name_mismatches;
    }
  }
  name_mismatches += static_cast<int>(names.size()) - static_cast<int>(inner.size());
  const bool same_parameters = trainer->parameters().size() == model->parameters().size();
  torch::optim::SGD opt(trainer->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = global_batch(step, world, per_rank);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(trainer(x.narrow(0, dist.rank() * per_rank, per_rank)),
                                         y.narrow(0, dist.rank() * per_rank, per_rank))
        .backward();
    opt.step();
  }
  const double between = diff_vs_rank0(dist, model->parameters());
  trainer->eval();
  const bool eval_reaches_module = !model->is_training() && !model->bn->is_training();
  trainer->train();
  const std::string path = dir + "/ddp-" + std::to_string(dist.rank()) + ".pt";
  torch::save(trainer->ddp, path);
  Net other;  // other values, the same architecture
  auto other_ddp = std::make_shared<DistributedDataParallel<NetImpl>>(other.ptr(), dist, small_buckets());
  torch::load(other_ddp, path);
  const double loaded_diff = all_max(dist, max_abs_diff(other->parameters(), model->parameters()));
  std::ostringstream printed;
  printed << *trainer;
  dist.print("RESULT ddp_module_name_mismatches=", name_mismatches);
  dist.print("RESULT ddp_module_same_parameters=", same_parameters ? 1 : 0);
  dist.print("RESULT ddp_module_diff_between_ranks=", between);
  dist.print("RESULT ddp_module_eval_reaches_module=", eval_reaches_module ? 1 : 0);
  dist.print("RESULT ddp_module_loaded_diff=", loaded_diff);
  dist.print("RESULT ddp_module_printed_as_ddp=",
             printed.str().find("(ddp): DistributedDataParallel(\n    (module): ") != std::string::npos ? 1 : 0);
  return 0;
}

// A hook that sums each bucket over the ranks without averaging, counting the buckets it sees in
// a state of its own: the gradients must be world x those of DDP without a hook.
int custom_hook() {
  auto dist = Distributed::init();
  const int world = dist.world_size(), per_rank = 3;
  Net a = rank_seeded_net(dist.rank());
  DistributedDataParallel<NetImpl> plain(a.ptr(), dist, small_buckets());
  Net b = reference_copy(a);
  DistributedDataParallel<NetImpl> hooked(b.ptr(), dist, small_buckets());
  struct SumState {
    c10::intrusive_ptr<c10d::ProcessGroup> group;
    std::vector<size_t> indices;
    int last_buckets = 0;
  };
  auto state = std::make_shared<SumState>();
  state->group = hooked.process_group();
  hooked.register_comm_hook(
      state,
      [](std::shared_ptr<SumState>& s, c10d::GradBucket& bucket) {
        s->indices.push_back(bucket.getIndex());
        if (bucket.isLast()) ++s->last_buckets;
        std::vector<at::Tensor> tensors{bucket.getBufferRef()};
        return s->group->allreduce(tensors)->getFuture();  // its value is [tensor]
      },
      "sum_hook");
  std::string second;
  try {
    hooked.register_comm_hook(comm_hooks::Builtin::allreduce);
  } catch (const std::exception& e) {
    second = e.what();
  }
  const int steps = 2;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, world, per_rank);
    auto xr = x.narrow(0, dist.rank() * per_rank, per_rank), yr = y.narrow(0, dist.rank() * per_rank, per_rank);
    for (auto& p : plain.parameters()) p.mutable_grad() = torch::Tensor();
    for (auto& p : hooked.parameters()) p.mutable_grad() = torch::Tensor();
    torch::nn::functional::cross_entropy(plain(xr), yr).backward();
    torch::nn::functional::cross_entropy(hooked(xr), yr).backward();
  }
  std::vector<torch::Tensor> expected, got;
  for (auto& p : plain.parameters()) expected.push_back(p.grad() * world);
  for (auto& p : hooked.parameters()) got.push_back(p.grad());
  const auto buckets = hooked.bucket_layout().size();
  // Step 1 runs one bucket; step 2 the rebuilt ones, indexed 0..n-1.
  bool indices_ok = state->indices.size() == 1 + buckets && state->indices[0] == 0;
  for (size_t i = 0; indices_ok && i < buckets; ++i) indices_ok = state->indices[1 + i] == i;
  dist.print("RESULT hook_calls=", state->indices.size(), " buckets=", buckets, " indices_ok=", indices_ok ? 1 : 0,
             " last_buckets=", state->last_buckets, " comm_hook=", hooked.logging_data().strs_map["comm_hook"]);
  dist.print("RESULT sum_vs_world_times_mean=", all_max(dist, max_abs_diff(got, expected)));
  dist.print("RESULT second_hook_error=", second.find("can only be called once") != std::string::npos ? 1 : 0);
  return 0;
}

// PowerSGD's factors at full rank span every gradient: after the vanilla iterations, both hooks
// must give DDP's average (up to the rounding of the orthogonalisation); at rank 1 they must not.
int powersgd() {
  auto dist = Distributed::init();
  const int world = dist.world_size(), per_rank = 3, steps = 4;
  Net base = rank_seeded_net(dist.rank());
  int64_t total = 0;
  for (auto& p : base->parameters()) total += p.numel();
  const auto side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(total))));
  // Everything in one bucket, so that the batched hook's square holds all of it.
  DdpOptions one_bucket;
  one_bucket.bucket_cap_bytes(64u << 20);
  one_bucket.first_bucket_cap_bytes(64u << 20);
  struct Run {
    std::string name;
    bool batched;
    int64_t rank;
  };
  const std::vector<Run> runs{{"layerwise_full", false, 1 << 20},
                              {"batched_full", true, side},
                              {"layerwise_rank1", false, 1},
                              {"batched_rank1", true, 1}};
  Net plain_net = reference_copy(base);
  DistributedDataParallel<NetImpl> plain(plain_net.ptr(), dist, one_bucket);
  std::vector<Net> nets;
  std::vector<std::unique_ptr<DistributedDataParallel<NetImpl>>> ddps;
  std::vector<comm_hooks::PowerSGDStatePtr> states;
  for (const Run& r : runs) {
    nets.push_back(reference_copy(base));
    ddps.push_back(std::make_unique<DistributedDataParallel<NetImpl>>(nets.back().ptr(), dist, one_bucket));
    // min_compression_rate 0: every matrix is compressed, vectors included.
    states.push_back(std::make_shared<comm_hooks::PowerSGDState>(
        ddps.back()->process_group(),
        comm_hooks::PowerSGDOptions().matrix_approximation_rank(r.rank).start_powerSGD_iter(2).min_compression_rate(
            0)));
    ddps.back()->register_comm_hook(states.back(),
                                    r.batched ? comm_hooks::batched_powerSGD_hook : comm_hooks::powerSGD_hook,
                                    r.batched ? "batched_powerSGD_hook" : "powerSGD_hook");
  }
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, world, per_rank);
    auto xr = x.narrow(0, dist.rank() * per_rank, per_rank), yr = y.narrow(0, dist.rank() * per_rank, per_rank);
    for (auto& p : plain.parameters()) p.mutable_grad() = torch::Tensor();
    torch::nn::functional::cross_entropy(plain(xr), yr).backward();
    for (auto& d : ddps) {
      for (auto& p : d->parameters()) p.mutable_grad() = torch::Tensor();
      torch::nn::functional::cross_entropy((*d)(xr), yr).backward();
    }
  }
  std::vector<torch::Tensor> expected;
  double scale = 0;
  for (auto& p : plain.parameters()) {
    expected.push_back(p.grad());
    scale = std::max(scale, p.grad().abs().max().item<double>());
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<torch::Tensor> got;
    for (auto& p : ddps[i]->parameters()) got.push_back(p.grad());
    const auto stats = states[i]->compression_stats();
    dist.print("RESULT ", runs[i].name, "_rel=", all_max(dist, max_abs_diff(got, expected)) / scale, " ", runs[i].name,
               "_iter=", states[i]->iter, " ", runs[i].name, "_rate=", stats.rate, " ", runs[i].name,
               "_hook=", ddps[i]->logging_data().strs_map["comm_hook"]);
  }
  std::string refused;
  try {
    comm_hooks::PowerSGDState bad(plain.process_group(), comm_hooks::PowerSGDOptions().start_powerSGD_iter(1));
  } catch (const std::invalid_argument& e) {
    refused = e.what();
  }
  dist.print("RESULT start_iter_1_refused=", refused.find("start_powerSGD_iter > 1") != std::string::npos ? 1 : 0);
  return 0;
}

// SyncBatchNorm on uneven batches (rank r holds batch_of(r) samples, rank 2 none) against
// BatchNorm on one process over the concatenated batch, for 1d, 2d and 3d inputs over two
// training steps: outputs, input gradients, the ranks' summed weight and bias gradients, the
// running statistics; then evaluation. Without a group it normalises the rank's batch alone.
int sync_batch_norm() {
  auto dist = Distributed::init();
  const int world = dist.world_size(), rank = dist.rank();
  auto batch_of = [](int r) -> int64_t { return r == 2 ? 0 : 5 - 3 * (r % 2); };
  int64_t total = 0, offset = 0;
  for (int r = 0; r < world; ++r) {
    if (r < rank) offset += batch_of(r);
    total += batch_of(r);
  }
  const int64_t channels = 3;
  double worst = 0, unsynced = 0;
  for (int dims : {2, 4, 5}) {
    torch::manual_seed(11 + dims);
    std::vector<int64_t> shape{total, channels};
    for (int d = 2; d < dims; ++d) shape.push_back(3 + d);
    torch::nn::BatchNorm2d plain(torch::nn::BatchNormOptions(channels).momentum(0.3));  // any rank of input
    SyncBatchNorm sync(torch::nn::BatchNormOptions(channels).momentum(0.3), dist.c10d_group());
    SyncBatchNorm alone(torch::nn::BatchNormOptions(channels).momentum(0.3));
    {
      torch::NoGradGuard no_grad;
      const auto w = torch::rand({channels}) + 0.5, b = torch::randn({channels});
      for (auto* m : {&plain->weight, &sync->weight, &alone->weight}) m->copy_(w);
      for (auto* m : {&plain->bias, &sync->bias, &alone->bias}) m->copy_(b);
    }
    auto compare = [&](const torch::Tensor& got, const torch::Tensor& want) {
      if (got.numel() == 0 && want.numel() == 0) return;
      const double scale = std::max(want.abs().max().item<double>(), 1e-12);
      worst = std::max(worst, (got - want).abs().max().item<double>() / scale);
    };
    for (int step = 0; step < 2; ++step) {
      const auto x = torch::randn(shape) * (1 + step) + step, g = torch::randn(shape);
      for (auto& p : plain->parameters()) p.mutable_grad() = torch::Tensor();
      for (auto& p : sync->parameters()) p.mutable_grad() = torch::Tensor();
      auto x_all = x.clone().requires_grad_(true);
      auto out_all = torch::batch_norm(x_all, plain->weight, plain->bias, plain->running_mean, plain->running_var, true,
                                       0.3, 1e-5, false);
      (out_all * g).sum().backward();
      auto x_mine = x.narrow(0, offset, batch_of(rank)).clone().requires_grad_(true);
      auto out = sync(x_mine);
      (out * g.narrow(0, offset, batch_of(rank))).sum().backward();
      compare(out, out_all.narrow(0, offset, batch_of(rank)));
      compare(x_mine.grad(), x_all.grad().narrow(0, offset, batch_of(rank)));
      std::vector<torch::Tensor> sums{sync->weight.grad().clone(), sync->bias.grad().clone()};
      for (auto& t : sums) {
        std::vector<torch::Tensor> one{t};
        dist.c10d_group()->allreduce(one)->wait();
      }
      compare(sums[0], plain->weight.grad());
      compare(sums[1], plain->bias.grad());
      compare(sync->running_mean, plain->running_mean);
      compare(sync->running_var, plain->running_var);
      if (batch_of(rank) > 1 && dims == 4) {
        auto local = alone(x.narrow(0, offset, batch_of(rank)));
        unsynced = std::max(unsynced, (local - out).abs().max().item<double>());
      }
    }
    if (sync->num_batches_tracked.item<int64_t>() != 2) worst = 1e9;
    sync->eval();
    const auto x = torch::randn(shape);
    torch::Tensor want;
    {
      torch::NoGradGuard no_grad;
      want = torch::batch_norm(x, plain->weight, plain->bias, plain->running_mean, plain->running_var, false, 0.3, 1e-5,
                               false);
    }
    compare(sync(x), want);
  }
  dist.print("RESULT sync_vs_whole_batch=", all_max(dist, worst));
  dist.print("RESULT alone_vs_sync=", all_max(dist, unsynced));
  std::string refused;
  try {
    SyncBatchNorm sync(channels);
    sync->set_process_group(dist.c10d_group());
    sync(torch::randn({1, channels, 2}));
  } catch (const std::exception& e) {
    refused = e.what();
  }
  // Each rank holds 2 values of a channel here: only a world of one lacks them.
  dist.print("RESULT tiny_batch_ok=", refused.empty() ? 1 : 0);
  return 0;
}

// ZeroRedundancyOptimizer. `train`: against DDP with a local optimizer over every parameter (SGD
// with momentum, Adam), bit for bit, with about 1/N of the optimizer state per rank; then a
// consolidated checkpoint of the Adam run after 4 steps (DIR/zero.pt, DIR/model.pt), and what
// one process training on the whole batch reaches after 6 steps with its Adam state kept
// (DIR/expected.pt) and reset after 4 (DIR/reset.pt). `resume` (any world size): 2 more steps from
// the checkpoint, compared with both.
namespace zero_test {
torch::nn::Sequential mlp() {
  torch::manual_seed(3);
  torch::nn::Sequential m;
  for (int i = 0; i < 8; ++i) {  // 8 equal layers: 1/N of them on each of 2 or 4 ranks
    m->push_back(torch::nn::Linear(24, 24));
    m->push_back(torch::nn::Functional(torch::relu));
  }
  m->push_back(torch::nn::Linear(24, 5));
  return m;
}
std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({12, 24}), torch::randint(0, 5, {12}, torch::kLong)};
}
std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}
double relative(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return diff / scale;
}
// One step on this rank's rows of the step's batch (all 12 rows without DDP).
template <typename Forward, typename Opt>
void step(Forward model, Opt& opt, int step, int rank, int world) {
  auto [x, y] = batch(step);
  const int64_t rows = 12 / world;
  opt.zero_grad();
  torch::nn::functional::cross_entropy(model(x.narrow(0, rank * rows, rows)), y.narrow(0, rank * rows, rows))
      .backward();
  opt.step();
}
}  // namespace zero_test

int zero(const std::string& phase, const std::string& dir) {
  using namespace zero_test;
  auto dist = Distributed::init();
  const int world = dist.world_size(), rank = dist.rank();
  if (12 % world != 0) throw std::invalid_argument("zero: the world size must divide 12");
  const auto group = dist.c10d_group();
  const auto sgd = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4);
  const auto adam = torch::optim::AdamOptions(1e-2).weight_decay(1e-3);
  if (phase == "train") {
    double worst = 0, state_share = 0;
    int64_t params_owned = 0;
    auto compare = [&](auto make_zero, auto make_full) {
      auto a = mlp(), b = mlp();
      DistributedDataParallel<torch::nn::SequentialImpl> za(a.ptr(), dist), fb(b.ptr(), dist);
      auto zero_opt = make_zero(za.parameters());
      auto full_opt = make_full(fb.parameters());
      for (int s = 0; s < 4; ++s) {
        step([&](const torch::Tensor& x) { return za(x); }, *zero_opt, s, rank, world);
        step([&](const torch::Tensor& x) { return fb(x); }, *full_opt, s, rank, world);
      }
      worst = std::max(worst, max_abs_diff(za.parameters(), fb.parameters()));
      int64_t full_bytes = 0;
      for (const auto& [key, state] : full_opt->state()) {
        torch::serialize::OutputArchive archive;
        state->serialize(archive);
        std::ostringstream out;
        archive.save_to(out);
        full_bytes += static_cast<int64_t>(out.str().size());
      }
      state_share =
          std::max(state_share, static_cast<double>(zero_opt->local_state_bytes()) / static_cast<double>(full_bytes));
      params_owned = static_cast<int64_t>(zero_opt->shards()[static_cast<size_t>(rank)].size());
      return std::make_pair(std::move(zero_opt), a);
    };
    compare(
        [&](std::vector<torch::Tensor> p) {
          return std::make_unique<ZeroRedundancyOptimizer<torch::optim::SGD>>(p, sgd, group);
        },
        [&](std::vector<torch::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, sgd); });
    auto [zero_adam, model] = compare(
        [&](std::vector<torch::Tensor> p) {
          return std::make_unique<ZeroRedundancyOptimizer<torch::optim::Adam>>(p, adam, group);
        },
        [&](std::vector<torch::Tensor> p) { return std::make_unique<torch::optim::Adam>(p, adam); });
    zero_adam->consolidate_state_dict(0);
    if (rank == 0) {
      zero_adam->save(dir + "/zero.pt");
      torch::save(snapshot(model->parameters()), dir + "/model.pt");
      // One process over the whole batch: 6 steps with one Adam, and 4 + 2 with a fresh one.
      auto whole = mlp();
      torch::optim::Adam opt(whole->parameters(), adam);
      auto on = [](torch::nn::Sequential& m) { return [m](const torch::Tensor& x) mutable { return m->forward(x); }; };
      for (int s = 0; s < 4; ++s) step(on(whole), opt, s, 0, 1);
      auto reset = mlp();
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < reset->parameters().size(); ++i) reset->parameters()[i].copy_(whole->parameters()[i]);
      }
      torch::optim::Adam fresh(reset->parameters(), adam);
      for (int s = 4; s < 6; ++s) {
        step(on(whole), opt, s, 0, 1);
        step(on(reset), fresh, s, 0, 1);
      }
      torch::save(snapshot(whole->parameters()), dir + "/expected.pt");
      torch::save(snapshot(reset->parameters()), dir + "/reset.pt");
    }
    dist.print("RESULT zero_vs_local_optimizer=", all_max(dist, worst));
    dist.print("RESULT state_share=", all_max(dist, state_share),
               " params_owned_min=", -all_max(dist, -static_cast<double>(params_owned)));
    dist.barrier();
    return 0;
  }
  auto model = mlp();
  std::vector<torch::Tensor> saved;
  torch::load(saved, dir + "/model.pt");
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < saved.size(); ++i) model->parameters()[i].copy_(saved[i]);
  }
  DistributedDataParallel<torch::nn::SequentialImpl> ddp(model.ptr(), dist);
  ZeroRedundancyOptimizer<torch::optim::Adam> opt(ddp.parameters(), adam, group);
  opt.load(dir + "/zero.pt");
  for (int s = 4; s < 6; ++s) step([&](const torch::Tensor& x) { return ddp(x); }, opt, s, rank, world);
  std::vector<torch::Tensor> expected, reset;
  torch::load(expected, dir + "/expected.pt");
  torch::load(reset, dir + "/reset.pt");
  const auto now = snapshot(ddp.parameters());
  dist.print("RESULT resumed_vs_expected=", all_max(dist, relative(now, expected)),
             " resumed_vs_reset=", -all_max(dist, -relative(now, reset)));
  std::string refused;
  try {
    auto other = torch::nn::Sequential(torch::nn::Linear(3, 3));
    ZeroRedundancyOptimizer<torch::optim::Adam> wrong(other->parameters(), adam, group);
    wrong.load(dir + "/zero.pt");
  } catch (const std::invalid_argument& e) {
    refused = e.what();
  }
  dist.print("RESULT wrong_model_refused=", refused.find("holds the state of") != std::string::npos ? 1 : 0);
  return 0;
}

}  // namespace ddprun::test::sdk_worker
