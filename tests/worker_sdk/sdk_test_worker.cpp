// Runs under ddprun (or alone) and checks the worker SDK against single-process references.
// Prints "RESULT key=value" lines from rank 0 for the GoogleTest driver to assert on.
//   sdk_test_worker ddp-equivalence STEPS [direct|process-group]
//   sdk_test_worker ddp-module DIR          (DDP as a module: nested, state dict names, save and load)
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
//   sdk_test_worker python-resume IN OUT sgd|adam|adamw FIRST STEPS
//       loads IN (a checkpoint Python saved) into a model and optimizer built with other values,
//       saves it again as OUT/roundtrip.pt, trains steps FIRST.. FIRST+STEPS-1 printing each loss,
//       saves OUT/final.pt (tests/python/test_worker_sdk_interop.py holds it all to Python)
//   sdk_test_worker qat-parity ENGINE IN OUT STEPS OBSERVER_OFF FREEZE_BN convert|train   (QAT against Python's)
//   sdk_test_worker qat-sequential ENGINE FLOAT_IN OUT STEPS OBSERVER_OFF FREEZE_BN   (qat::prepare_qat)
//   sdk_test_worker qat-sync-bn               (a QAT ConvBnReLU2d with SyncBatchNorm against the whole batch)
//   sdk_test_worker qat-clone                 (clone() of a trained and of a converted QAT model)
//   sdk_test_worker torch-load FILE...    (no launcher: "OK <tensors>" or "ERROR <why>" per file)
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
#include "sdk_test_worker.hpp"

using namespace ddprun::worker;
using namespace ddprun::test::sdk_worker;

namespace {

struct WithUnusedImpl : torch::nn::Module {
  WithUnusedImpl() {
    used = register_module("used", torch::nn::Linear(4, 2));
    unused = register_module("unused", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return used(x); }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};
TORCH_MODULE(WithUnused);

int ddp_equivalence(int steps, const std::string& reducer) {
  auto dist = Distributed::init();
  const int world = dist.world_size(), per_rank = 4;
  Net model = rank_seeded_net(dist.rank());
  DdpOptions options = small_buckets();
  options.direct_gloo(reducer != "process-group");
  DistributedDataParallel ddp(model, dist, options);  // the module holder, its type deduced
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

int unused_parameter(const std::string& how) {
  auto dist = Distributed::init();
  WithUnused model;
  DdpOptions o;
  o.find_unused_parameters(how == "find");
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
  o.broadcast_buffers(false);
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

// Batches of a dataset's own indices, for a LibTorch data loader.
struct IndexDataset : torch::data::datasets::BatchDataset<IndexDataset, std::vector<size_t>> {
  explicit IndexDataset(size_t n) : n_(n) {}
  std::vector<size_t> get_batch(c10::ArrayRef<size_t> indices) override { return indices.vec(); }
  c10::optional<size_t> size() const override { return n_; }
  size_t n_;
};

// The indices of one pass of a LibTorch data loader over `loader`, as a JSON list.
template <typename Loader>
std::string one_pass(Loader& loader) {
  std::string out = "[";
  for (const std::vector<size_t>& batch : loader) {
    for (size_t i : batch) out += (out.size() > 1 ? "," : "") + std::to_string(i);
  }
  return out + "]";
}

int sampler_grid() {
  for (int64_t size : {0, 1, 7, 10, 33, 100}) {
    for (int replicas : {1, 2, 3, 4}) {
      for (uint64_t seed : {0ULL, 1234ULL}) {
        for (uint64_t epoch : {0ULL, 3ULL}) {
          for (bool shuffle : {true, false}) {
            for (bool drop_last : {false, true}) {
              for (int rank = 0; rank < replicas; ++rank) {
                const auto options = SamplerOptions().shuffle(shuffle).seed(seed).drop_last(drop_last);
                RankSampler s(size, replicas, rank, options);
                s.set_epoch(epoch);
                std::cout << "{\"size\":" << size << ",\"replicas\":" << replicas << ",\"rank\":" << rank
                          << ",\"seed\":" << seed << ",\"epoch\":" << epoch << ",\"shuffle\":" << shuffle
                          << ",\"drop_last\":" << drop_last << ",\"len\":" << s.size() << ",\"indices\":[";
                const auto idx = s.indices();
                for (size_t i = 0; i < idx.size(); ++i) std::cout << (i ? "," : "") << idx[i];
                // The same sampler in a LibTorch data loader: this epoch's pass, then the next epoch's.
                auto loader = torch::data::make_data_loader(IndexDataset(static_cast<size_t>(size)), std::move(s),
                                                            torch::data::DataLoaderOptions().batch_size(3));
                const std::string first = one_pass(*loader);
                std::cout << "],\"loader\":" << first << ",\"loader_next_epoch\":" << one_pass(*loader) << "}\n";
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
    torch::nn::functional::cross_entropy(ddp(x.narrow(0, dist.rank() * 2, 2)), y.narrow(0, dist.rank() * 2, 2))
        .backward();
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

// The other side of the Python test's checkpoints: the optimizer is built with hyperparameters
// that differ from the file's (loading must replace them, as Python's load_state_dict does).
int python_resume(const std::string& in, const std::string& out, const std::string& optim, int first, int steps) {
  auto dist = interop_init();
  const auto device = interop_device(dist);
  Net model = rank_seeded_net(99);
  model->to(device);
  DistributedDataParallel<NetImpl> ddp(model.ptr(), dist);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (optim == "sgd") opt = std::make_unique<torch::optim::SGD>(ddp.parameters(), torch::optim::SGDOptions(0.5));
  if (optim == "adam") opt = std::make_unique<torch::optim::Adam>(ddp.parameters(), torch::optim::AdamOptions(0.5));
  if (optim == "adamw") opt = std::make_unique<torch::optim::AdamW>(ddp.parameters(), torch::optim::AdamWOptions(0.5));
  if (!opt) throw std::invalid_argument("optimizer " + optim + "?");
  const auto epoch = load_checkpoint(in, ddp.module(), opt.get());
  dist.print("RESULT loaded_epoch=", epoch.value_or(-1));
  save_checkpoint(out + "/roundtrip.pt", ddp.module(), opt.get(), epoch.value_or(-1), dist);
  for (int step = first; step < first + steps; ++step) {
    auto [x, y] = global_batch(step, dist.world_size(), 4);
    opt->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(ddp(x.narrow(0, dist.rank() * 4, 4).to(device)),
                                                     y.narrow(0, dist.rank() * 4, 4).to(device));
    loss.backward();
    opt->step();
    char hex[64];
    std::snprintf(hex, sizeof hex, "%a", loss.item<double>());
    dist.print("RESULT loss ", step, " ", hex);
  }
  save_checkpoint(out + "/final.pt", ddp.module(), opt.get(), first + steps - 1, dist);
  return 0;
}

int64_t count_tensors(const c10::IValue& v) {
  if (v.isTensor()) return 1;
  int64_t n = 0;
  if (v.isList())
    for (const auto& e : v.toListRef()) n += count_tensors(e);
  if (v.isTuple())
    for (const auto& e : v.toTupleRef().elements()) n += count_tensors(e);
  if (v.isGenericDict())
    for (const auto& kv : v.toGenericDict()) n += count_tensors(kv.value());
  return n;
}

// Reads each file with torch_load: every one gets a line, whatever is in it.
int torch_load_files(int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    try {
      const int64_t tensors = count_tensors(torch_load(argv[i]));
      std::cout << "OK " << tensors << std::endl;
    } catch (const std::exception& e) {
      std::string why = e.what();
      std::replace(why.begin(), why.end(), '\n', ' ');
      std::cout << "ERROR " << why << std::endl;
    }
  }
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
  o.broadcast_buffers(false);
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
    interop_kernels();
    if (mode == "ddp-equivalence") return ddp_equivalence(std::stoi(argv[2]), argc > 3 ? argv[3] : "direct");
    if (mode == "ddp-module") return ddp_module(argv[2]);
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
    if (mode == "python-resume") {
      return python_resume(argv[2], argv[3], argv[4], std::stoi(argv[5]), std::stoi(argv[6]));
    }
    if (mode == "qat-parity") {
      return qat_parity(argv[2], argv[3], argv[4], std::stoi(argv[5]), std::stoi(argv[6]), std::stoi(argv[7]),
                        std::string(argv[8]) == "convert");
    }
    if (mode == "qat-sequential") {
      return qat_prepare_sequential(argv[2], argv[3], argv[4], std::stoi(argv[5]), std::stoi(argv[6]),
                                    std::stoi(argv[7]));
    }
    if (mode == "qat-sync-bn") return qat_sync_bn();
    if (mode == "qat-clone") return qat_clone();
    if (mode == "torch-load") return torch_load_files(argc, argv);
    if (mode == "train") return train(std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]));
    std::cerr << "unknown mode '" << mode << "'\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "sdk_test_worker: " << e.what() << "\n";
    return 1;
  }
}
