// Runs under ddprun (or alone) and checks the worker SDK against single-process references.
// Prints "RESULT key=value" lines from rank 0 for the GoogleTest driver to assert on.
//   sdk_test_worker ddp-equivalence STEPS [direct|process-group]
//   sdk_test_worker no-sync
//   sdk_test_worker unused-parameter find|report
//   sdk_test_worker custom-hook             (a communication hook of the user's, with its own state)
//   sdk_test_worker powersgd                (PowerSGD at full rank is the average; at rank 1 it is not)
//   sdk_test_worker sync-batch-norm         (SyncBatchNorm against BatchNorm over the whole batch)
//   sdk_test_worker zero train|resume DIR   (ZeroRedundancyOptimizer; a checkpoint made in train resumes)
//   sdk_test_worker peer-exits               (the last rank leaves after 2 steps)
//   sdk_test_worker sampler-grid              (no launcher needed: JSON lines for the Python test)
//   sdk_test_worker checkpoint DIR
//   sdk_test_worker resume DIR EPOCHS FAIL_AT_EPOCH
//   sdk_test_worker checkpoint-race PATH BASE_EPOCH TIMES   (several at once on one PATH)
//   sdk_test_worker checkpoint-full DIR      (a save that fails must keep the previous checkpoint)
//   sdk_test_worker checkpoint-once PATH
//   sdk_test_worker train STEPS STALL_RANK SLOW_RANK SLOW_MS
//       DDP training for STEPS steps; STALL_RANK (-1: none) then stops in its own code, the others
//       go on into the next step's all-reduce; SLOW_RANK (-1: none) computes SLOW_MS longer per step
#include <signal.h>
#include <unistd.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "ddprun/worker.hpp"

using namespace ddprun::worker;

namespace {

// Conv + BatchNorm + Linear: several buckets with small caps, and a BatchNorm buffer.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
    fc1 = register_module("fc1", torch::nn::Linear(4 * 8 * 8, 33));
    fc2 = register_module("fc2", torch::nn::Linear(33, 5));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn(conv(x)));
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

struct WithUnusedImpl : torch::nn::Module {
  WithUnusedImpl() {
    used = register_module("used", torch::nn::Linear(4, 2));
    unused = register_module("unused", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return used(x); }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};
TORCH_MODULE(WithUnused);

DdpOptions small_buckets() {
  DdpOptions o;
  o.first_bucket_cap_bytes = 200;  // odd sizes: buckets close in the middle of layers' tensors
  o.bucket_cap_bytes = 3000;
  return o;
}

// The global batch of a step (world * per_rank samples), identical on every rank.
std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int world, int per_rank) {
  torch::manual_seed(1000 + step);
  return {torch::randn({world * per_rank, 1, 8, 8}), torch::randint(0, 5, {world * per_rank})};
}

double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
  return m;
}

double all_max(Distributed& dist, double value) {
  auto t = torch::tensor({value}, torch::kFloat64);
  std::vector<torch::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  dist.process_group()->allreduce(ts, opts)->wait();
  return t.item<double>();
}

// Largest difference between this rank's parameters and rank 0's, over all ranks.
double diff_vs_rank0(Distributed& dist, const std::vector<torch::Tensor>& params) {
  double m = 0;
  for (const auto& p : params) {
    auto root = p.detach().clone();
    std::vector<torch::Tensor> t{root};
    dist.process_group()->broadcast(t)->wait();
    m = std::max(m, (p.detach() - root).abs().max().item<double>());
  }
  return all_max(dist, m);
}

// A model whose initial parameters differ per rank; DDP must replace them with rank 0's.
Net rank_seeded_net(int rank) {
  torch::manual_seed(7 + rank);
  return Net();
}

// A single-process copy of the (already broadcast) DDP model's parameters.
Net reference_copy(Net& of) {
  Net ref;
  torch::NoGradGuard g;
  auto src = of->parameters(), dst = ref->parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  return ref;
}

int ddp_equivalence(int steps, const std::string& reducer) {
  auto dist = Distributed::init();
  const int world = dist.world_size(), per_rank = 4;
  Net model = rank_seeded_net(dist.rank());
  DdpOptions options = small_buckets();
  options.direct_gloo = reducer != "process-group";
  DistributedDataParallel<NetImpl> ddp(model.ptr(), dist, options);
  Net reference = reference_copy(model);
  const double init_between = diff_vs_rank0(dist, ddp.parameters());

  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, world, per_rank);
    opt.zero_grad();
    auto out = ddp(x.narrow(0, dist.rank() * per_rank, per_rank));
    torch::nn::functional::cross_entropy(out, y.narrow(0, dist.rank() * per_rank, per_rank)).backward();
    opt.step();
    // Reference: one process, the whole batch, with BatchNorm statistics per shard as each rank sees them.
    ref_opt.zero_grad();
    for (int r = 0; r < world; ++r) {
      auto ref_out = reference->forward(x.narrow(0, r * per_rank, per_rank));
      (torch::nn::functional::cross_entropy(ref_out, y.narrow(0, r * per_rank, per_rank)) / world).backward();
    }
    ref_opt.step();
  }
  const double vs_single = all_max(dist, max_abs_diff(ddp.parameters(), reference->parameters()));
  const double between = diff_vs_rank0(dist, ddp.parameters());
  // Buffers are broadcast from rank 0 before each forward that follows a training one, as PyTorch's
  // DDP does: an evaluation forward (which leaves BatchNorm's statistics alone) makes them equal.
  ddp.eval();
  {
    torch::NoGradGuard no_grad;
    ddp(global_batch(0, 1, per_rank).first);
  }
  const double buffers_between = diff_vs_rank0(dist, model->buffers());
  dist.print("RESULT buckets=", ddp.bucket_layout().size());
  dist.print("RESULT direct_gloo=", ddp.uses_direct_gloo() ? 1 : 0);
  dist.print("RESULT init_diff_between_ranks=", init_between);
  dist.print("RESULT max_abs_diff_vs_single=", vs_single);
  dist.print("RESULT max_abs_diff_between_ranks=", between);
  dist.print("RESULT buffer_diff_between_ranks=", buffers_between);
  dist.print("RESULT world_size=", world);
  return 0;
}

int no_sync() {
  auto dist = Distributed::init();
  const int world = dist.world_size(), per_rank = 3;
  Net model = rank_seeded_net(dist.rank());
  DistributedDataParallel<NetImpl> ddp(model.ptr(), dist, small_buckets());
  Net reference = reference_copy(model);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.05));
  auto [x1, y1] = global_batch(1, world, per_rank);
  auto [x2, y2] = global_batch(2, world, per_rank);
  auto shard = [&](const torch::Tensor& t, int r) { return t.narrow(0, r * per_rank, per_rank); };
  opt.zero_grad();
  {
    auto guard = ddp.no_sync();
    torch::nn::functional::cross_entropy(ddp(shard(x1, dist.rank())), shard(y1, dist.rank())).backward();
  }
  // Local gradients only so far: ranks differ.
  double local_diff = 0;
  for (auto& p : ddp.parameters()) local_diff += p.grad().abs().sum().item<double>();
  const double spread = all_max(dist, local_diff) - (-all_max(dist, -local_diff));
  torch::nn::functional::cross_entropy(ddp(shard(x2, dist.rank())), shard(y2, dist.rank())).backward();
  opt.step();
  ref_opt.zero_grad();
  for (int r = 0; r < world; ++r) {
    (torch::nn::functional::cross_entropy(reference->forward(shard(x1, r)), shard(y1, r)) / world).backward();
    (torch::nn::functional::cross_entropy(reference->forward(shard(x2, r)), shard(y2, r)) / world).backward();
  }
  ref_opt.step();
  dist.print("RESULT local_grads_differed=", spread > 0 ? 1 : 0);
  dist.print("RESULT max_abs_diff_vs_single=", all_max(dist, max_abs_diff(ddp.parameters(), reference->parameters())));
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
             " last_buckets=", state->last_buckets,
             " comm_hook=", hooked.logging_data().strs_map["comm_hook"]);
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
  one_bucket.bucket_cap_bytes = 64u << 20;
  one_bucket.first_bucket_cap_bytes = 64u << 20;
  struct Run {
    std::string name;
    bool batched;
    int64_t rank;
  };
  const std::vector<Run> runs{{"layerwise_full", false, 1 << 20}, {"batched_full", true, side},
                              {"layerwise_rank1", false, 1}, {"batched_rank1", true, 1}};
  Net plain_net = reference_copy(base);
  DistributedDataParallel<NetImpl> plain(plain_net.ptr(), dist, one_bucket);
  std::vector<Net> nets;
  std::vector<std::unique_ptr<DistributedDataParallel<NetImpl>>> ddps;
  std::vector<comm_hooks::PowerSGDStatePtr> states;
  for (const Run& r : runs) {
    nets.push_back(reference_copy(base));
    ddps.push_back(std::make_unique<DistributedDataParallel<NetImpl>>(nets.back().ptr(), dist, one_bucket));
    // min_compression_rate 0: every matrix is compressed, vectors included.
    states.push_back(std::make_shared<comm_hooks::PowerSGDState>(ddps.back()->process_group(), r.rank, 2, 0.0));
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
    dist.print("RESULT ", runs[i].name, "_rel=", all_max(dist, max_abs_diff(got, expected)) / scale, " ",
               runs[i].name, "_iter=", states[i]->iter, " ", runs[i].name, "_rate=", stats.rate, " ", runs[i].name,
               "_hook=", ddps[i]->logging_data().strs_map["comm_hook"]);
  }
  std::string refused;
  try {
    comm_hooks::PowerSGDState bad(plain.process_group(), 1, 1);
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
      auto out_all = torch::batch_norm(x_all, plain->weight, plain->bias, plain->running_mean, plain->running_var,
                                       true, 0.3, 1e-5, false);
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
      want = torch::batch_norm(x, plain->weight, plain->bias, plain->running_mean, plain->running_var, false, 0.3,
                               1e-5, false);
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
  torch::nn::functional::cross_entropy(model(x.narrow(0, rank * rows, rows)),
                                       y.narrow(0, rank * rows, rows))
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
      state_share = std::max(state_share, static_cast<double>(zero_opt->local_state_bytes()) / full_bytes);
      params_owned = static_cast<int64_t>(zero_opt->shards()[static_cast<size_t>(rank)].size());
      return std::make_pair(std::move(zero_opt), a);
    };
    compare([&](std::vector<torch::Tensor> p) { return std::make_unique<ZeroRedundancyOptimizer<torch::optim::SGD>>(p, sgd, group); },
            [&](std::vector<torch::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, sgd); });
    auto [zero_adam, model] =
        compare([&](std::vector<torch::Tensor> p) { return std::make_unique<ZeroRedundancyOptimizer<torch::optim::Adam>>(p, adam, group); },
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
    dist.print("RESULT state_share=", all_max(dist, state_share), " params_owned_min=", -all_max(dist, -params_owned));
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

int unused_parameter(const std::string& how) {
  auto dist = Distributed::init();
  WithUnused model;
  DdpOptions o;
  o.find_unused_parameters = how == "find";
  DistributedDataParallel<WithUnusedImpl> ddp(model.ptr(), dist, o);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    try {
      ddp(torch::ones({2, 4}) * (dist.rank() + 1)).sum().backward();
    } catch (const std::exception& e) {
      dist.print("RESULT error=", e.what());
      return 0;
    }
    opt.step();
  }
  // Unused on every rank: its gradient stays undefined, so optimizers leave it alone.
  dist.print("RESULT unused_grad_defined=", model->unused->weight.grad().defined() ? 1 : 0);
  dist.print("RESULT used_grad=", model->used->weight.grad()[0][0].item<double>());
  return 0;
}

// The last rank returns after two steps without a word; the others must get an error from the
// gradient all-reduce naming the cause, not hang. Buffers are not broadcast, so the first
// collective that notices is DDP's own.
int peer_exits() {
  auto dist = Distributed::init();
  Net model = rank_seeded_net(0);
  DdpOptions o;
  o.broadcast_buffers = false;
  DistributedDataParallel<NetImpl> ddp(model.ptr(), dist, o);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1));
  auto [x, y] = global_batch(0, 1, 4);
  const bool leaver = dist.rank() == dist.world_size() - 1;
  for (int step = 0; step < 6; ++step) {
    if (leaver && step == 2) return 0;
    opt.zero_grad();
    try {
      torch::nn::functional::cross_entropy(ddp(x), y).backward();
    } catch (const std::exception& e) {
      std::cout << "RESULT failed_step=" << step << "\nERROR " << e.what() << std::endl;
      return 3;
    }
    opt.step();
  }
  std::cout << "RESULT failed_step=none" << std::endl;
  return 0;
}

int sampler_grid() {
  for (int64_t size : {0, 1, 7, 10, 33, 100}) {
    for (int replicas : {1, 2, 3, 4}) {
      for (uint64_t seed : {0ULL, 1234ULL}) {
        for (uint64_t epoch : {0ULL, 3ULL}) {
          for (bool shuffle : {true, false}) {
            for (bool drop_last : {false, true}) {
              for (int rank = 0; rank < replicas; ++rank) {
                DistributedSampler s(size, replicas, rank, SamplerOptions{shuffle, seed, drop_last});
                s.set_epoch(epoch);
                std::cout << "{\"size\":" << size << ",\"replicas\":" << replicas << ",\"rank\":" << rank
                          << ",\"seed\":" << seed << ",\"epoch\":" << epoch << ",\"shuffle\":" << shuffle
                          << ",\"drop_last\":" << drop_last << ",\"len\":" << s.size() << ",\"indices\":[";
                const auto idx = s.indices();
                for (size_t i = 0; i < idx.size(); ++i) std::cout << (i ? "," : "") << idx[i];
                std::cout << "]}\n";
              }
            }
          }
        }
      }
    }
  }
  return 0;
}

int checkpoint(const std::string& dir) {
  auto dist = Distributed::init();
  Net model = rank_seeded_net(0);
  DistributedDataParallel<NetImpl> ddp(model.ptr(), dist);
  torch::optim::Adam opt(ddp.parameters(), torch::optim::AdamOptions(1e-3));
  auto [x, y] = global_batch(0, 1, 4);
  torch::nn::functional::cross_entropy(ddp(x), y).backward();
  opt.step();
  save_checkpoint(dir + "/ckpt.pt", ddp.module(), &opt, 5, dist);
  Net fresh = rank_seeded_net(99);
  torch::optim::Adam fresh_opt(fresh->parameters(), torch::optim::AdamOptions(1e-3));
  const auto epoch = load_checkpoint(dir + "/ckpt.pt", *fresh, &fresh_opt);
  std::vector<torch::Tensor> a = model->parameters(), b = fresh->parameters();
  for (auto& t : model->buffers()) a.push_back(t);
  for (auto& t : fresh->buffers()) b.push_back(t);
  dist.print("RESULT loaded_epoch=", epoch.value_or(-1));
  dist.print("RESULT roundtrip_diff=", max_abs_diff(a, b));
  // A state dict saved with DDP's "module." prefix (as Python DDP's state_dict() has) loads too.
  if (dist.is_main()) {
    c10::Dict<std::string, at::Tensor> prefixed;
    for (const auto& item : model->named_parameters()) prefixed.insert("module." + item.key(), item.value().detach());
    for (const auto& item : model->named_buffers()) prefixed.insert("module." + item.key(), item.value().detach());
    c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
    root.insert("model", prefixed);
    root.insert("epoch", int64_t{2});
    const auto data = torch::pickle_save(root);
    std::ofstream(dir + "/prefixed.pt", std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
    Net other = rank_seeded_net(123);
    load_checkpoint(dir + "/prefixed.pt", *other, nullptr);
    std::vector<torch::Tensor> c = other->parameters();
    dist.print("RESULT prefixed_load_diff=", max_abs_diff(model->parameters(), c));
  }
  dist.print("RESULT missing_file=", load_checkpoint(dir + "/nope.pt", *fresh, nullptr).has_value() ? 1 : 0);
  return 0;
}

// Saves a small checkpoint to `path` `times` times (epochs base..base+times-1), loading it after
// each save: another process saving to the same path at once must never make a save fail or
// leave a file that does not load.
int checkpoint_race(const std::string& path, int base, int times) {
  auto dist = Distributed::init();
  Net model = rank_seeded_net(0);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  int loaded = 0;
  for (int i = 0; i < times; ++i) {
    save_checkpoint(path, *model, &opt, base + i, dist);
    Net other = rank_seeded_net(1);
    if (load_checkpoint(path, *other, nullptr)) ++loaded;
  }
  dist.print("RESULT race_saves=", times, " race_loads=", loaded);
  return 0;
}

// A save that fails (the file size limit stands in for a full disk) throws an error naming the
// file and leaves the previous checkpoint, and no temporary file, behind.
int checkpoint_full(const std::string& dir) {
  auto dist = Distributed::init();
  Net model = rank_seeded_net(0);
  const std::string path = dir + "/ckpt.pt";
  save_checkpoint(path, *model, nullptr, 7, dist);
  ::signal(SIGXFSZ, SIG_IGN);  // write(2) then fails with EFBIG instead of killing the process
  rlimit small{4096, 4096}, old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  ::setrlimit(RLIMIT_FSIZE, &small);
  std::string error = "none";
  try {
    save_checkpoint(path, *model, nullptr, 8, dist);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // The hard limit was lowered too: a new process would be needed to raise it again, and loading
  // does not write.
  Net other = rank_seeded_net(1);
  const auto epoch = load_checkpoint(path, *other, nullptr);
  int leftovers = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) leftovers += e.path().filename() != "ckpt.pt";
  std::cout << "RESULT loaded_epoch=" << epoch.value_or(-1) << " leftovers=" << leftovers << std::endl;
  std::cout << "RESULT_ERROR " << error << std::endl;
  return 0;
}

int checkpoint_once(const std::string& path) {
  auto dist = Distributed::init();
  Net model = rank_seeded_net(0);
  save_checkpoint(path, *model, nullptr, 1, dist);
  return 0;
}

int resume(const std::string& dir, int epochs, int fail_at) {
  auto dist = Distributed::init();
  Net model = rank_seeded_net(dist.rank());
  DistributedDataParallel<NetImpl> ddp(model.ptr(), dist);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.01));
  int start = 0;
  if (auto done = load_checkpoint(dir + "/latest.pt", ddp.module(), &opt)) start = static_cast<int>(*done) + 1;
  dist.print("RESULT attempt=", dist.env().restart_count, " start_epoch=", start);
  for (int epoch = start; epoch < epochs; ++epoch) {
    auto [x, y] = global_batch(epoch, dist.world_size(), 2);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(ddp(x.narrow(0, dist.rank() * 2, 2)), y.narrow(0, dist.rank() * 2, 2)).backward();
    opt.step();
    save_checkpoint(dir + "/latest.pt", ddp.module(), &opt, epoch, dist);
    if (epoch == fail_at && dist.env().restart_count == 0 && dist.rank() == dist.world_size() - 1) {
      std::cerr << "simulated crash after epoch " << epoch << "\n";
      std::_Exit(9);
    }
  }
  dist.print("RESULT finished_epochs=", epochs);
  return 0;
}

[[noreturn]] void stall_in_user_code() {
  std::cout << "hanging now" << std::endl;
  for (;;) ::pause();
}

int train(int steps, int stall_rank, int slow_rank, int slow_ms) {
  auto dist = Distributed::init();
  Net model = rank_seeded_net(0);
  DdpOptions o;
  // No buffer broadcast: the others then wait in the gradient all-reduce, where the direct Gloo
  // reducer spins (busy polling) when the ranks fit the cores.
  o.broadcast_buffers = false;
  DistributedDataParallel<NetImpl> ddp(model.ptr(), dist, o);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.01));
  auto [x, y] = global_batch(0, 1, 8);
  for (int step = 0; step < steps + (stall_rank >= 0 ? 1 : 0); ++step) {
    if (step == steps && dist.rank() == stall_rank) stall_in_user_code();
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(ddp(x), y);
    if (dist.rank() == slow_rank) {
      // Extra computation, as a slower GPU or a busier host would add.
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(slow_ms);
      auto m = torch::randn({64, 64});
      while (std::chrono::steady_clock::now() < until) m = torch::tanh(m.mm(m));
    }
    loss.backward();
    opt.step();
  }
  std::cout << "RESULT trained=" << steps << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "ddp-equivalence") return ddp_equivalence(std::stoi(argv[2]), argc > 3 ? argv[3] : "direct");
    if (mode == "no-sync") return no_sync();
    if (mode == "unused-parameter") return unused_parameter(argv[2]);
    if (mode == "custom-hook") return custom_hook();
    if (mode == "powersgd") return powersgd();
    if (mode == "sync-batch-norm") return sync_batch_norm();
    if (mode == "zero") return zero(argv[2], argv[3]);
    if (mode == "sampler-grid") return sampler_grid();
    if (mode == "peer-exits") return peer_exits();
    if (mode == "checkpoint") return checkpoint(argv[2]);
    if (mode == "resume") return resume(argv[2], std::stoi(argv[3]), std::stoi(argv[4]));
    if (mode == "checkpoint-race") return checkpoint_race(argv[2], std::stoi(argv[3]), std::stoi(argv[4]));
    if (mode == "checkpoint-full") return checkpoint_full(argv[2]);
    if (mode == "checkpoint-once") return checkpoint_once(argv[2]);
    if (mode == "train") return train(std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]));
    std::cerr << "unknown mode '" << mode << "'\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "sdk_test_worker: " << e.what() << "\n";
    return 1;
  }
}
