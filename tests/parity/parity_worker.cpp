// The worker SDK's side of the parity suite (tests/parity/parity.py has Python DDP's side and the
// case table): one rank, under ddprun.
//   parity_worker DIR OUT [direct|process-group]
// Reads DIR/case.json, DIR/init.* and DIR/data.*, builds the same model as parity.py's Net, trains
// as the case says and writes OUT/rank<R>.{json,bin}: every parameter, gradient (or that it is
// undefined) and buffer, DDP's logging data and which gradients are views; or the error that
// stopped this rank.
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ddprun/worker.hpp"

using namespace ddprun::worker;
using nlohmann::json;

namespace {

constexpr int kIn = 32, kClasses = 10;

// --- tensor files (the format parity.py documents) ------------------------------------------------

std::map<std::string, torch::Tensor> read_tensors(const std::string& prefix) {
  std::ifstream meta_in(prefix + ".json");
  const json meta = json::parse(meta_in);
  std::ifstream bin(prefix + ".bin", std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(bin)), std::istreambuf_iterator<char>());
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : meta.at("tensors")) {
    if (e.value("undefined", false)) {
      out[e.at("name")] = torch::Tensor();
      continue;
    }
    std::vector<int64_t> shape = e.at("shape");
    auto t = torch::empty(shape, torch::kFloat32);
    std::memcpy(t.data_ptr<float>(), raw.data() + 4 * e.at("offset").get<size_t>(), 4 * t.numel());
    out[e.at("name")] = t;
  }
  return out;
}

void write_tensors(const std::string& prefix, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                   json fields) {
  json entries = json::array();
  std::ofstream bin(prefix + ".bin", std::ios::binary);
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) {
      entries.push_back({{"name", name}, {"undefined", true}});
      continue;
    }
    auto c = t.detach().to(torch::kFloat32).contiguous().cpu();
    entries.push_back({{"name", name}, {"shape", c.sizes().vec()}, {"offset", offset}});
    bin.write(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<std::streamsize>(4 * c.numel()));
    offset += static_cast<size_t>(c.numel());
  }
  fields["tensors"] = entries;
  std::ofstream(prefix + ".json") << fields.dump(1);
}

// --- the model: parity.py's Net, registered in the same order -------------------------------------

struct TiedLinearImpl : torch::nn::Module {
  TiedLinearImpl(torch::Tensor shared, int64_t out) {
    weight = register_parameter("weight", shared);
    bias = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(TiedLinear);

struct NetImpl : torch::nn::Module {
  NetImpl(const json& m, int rank) : m_(m) {
    const int hidden = m.at("hidden").get<int>() + (m.at("mismatch").get<bool>() && rank == 1 ? 1 : 0);
    fc1 = register_module("fc1", torch::nn::Linear(kIn, hidden));
    if (m.at("bn").get<bool>() && m.at("sync_bn").get<bool>()) {
      sync_bn = register_module("bn", SyncBatchNorm(hidden));
    } else if (m.at("bn").get<bool>()) {
      bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    }
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    if (m.at("tied").get<bool>()) fc4 = register_module("fc4", TiedLinear(fc2->weight, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, kClasses));
    if (m.at("extra") != "none") extra = register_module("extra", torch::nn::Linear(hidden, kClasses));
    use_extra = m.at("extra") == "rank0" && rank == 0;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc1(x));
    if (bn) h = bn(h);
    if (sync_bn) h = sync_bn(h);
    h = torch::relu(fc2(h));
    if (m_.at("twice").get<bool>()) h = torch::relu(fc2(h));
    if (fc4) h = torch::relu(fc4(h));
    auto out = fc3(h);
    if (use_extra) out = out + extra(h);
    return out;
  }
  json m_;
  bool use_extra = false;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, extra{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  SyncBatchNorm sync_bn{nullptr};  // "bn" when the case's model has sync_bn
  TiedLinear fc4{nullptr};
};
TORCH_MODULE(Net);

// named_parameters()/named_buffers() with each tensor once, as Python lists them.
std::vector<std::pair<std::string, torch::Tensor>> unique(const torch::OrderedDict<std::string, torch::Tensor>& d) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : d) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value());
  }
  return out;
}

// optimizer.zero_grad(set_to_none=...) as Python 1.13 and 2.x do it.
void zero_grad(const std::vector<torch::Tensor>& params, bool set_to_none) {
  for (auto p : params) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.mutable_grad() = torch::Tensor();
    } else {
      if (p.grad().grad_fn()) {
        p.mutable_grad() = p.grad().detach();
      } else {
        p.mutable_grad().requires_grad_(false);
      }
      p.mutable_grad().zero_();
    }
  }
}

#if TORCH_VERSION_MAJOR >= 2
// Python 2.x's Adam (torch/optim/adam.py, _single_tensor_adam, as it runs on CPU), step for step.
// LibTorch 2.x's torch::optim::Adam updates the first moment with mul_().add_() where Python uses
// lerp_(), which rounds differently: the two optimizers part in the last bits after one step.
// This suite compares DDP, so both sides run Python's arithmetic.
class PythonAdam final : public torch::optim::Optimizer {
 public:
  PythonAdam(std::vector<torch::Tensor> params, double lr, double weight_decay)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::AdamOptions>(lr)),
        lr_(lr),
        weight_decay_(weight_decay) {}
  torch::Tensor step(LossClosure) override {
    torch::NoGradGuard no_grad;
    for (auto& p : param_groups_[0].params()) {
      if (!p.grad().defined()) continue;
      auto& s = moments_[p.unsafeGetTensorImpl()];
      if (!s.exp_avg.defined()) {
        s.exp_avg = torch::zeros_like(p);
        s.exp_avg_sq = torch::zeros_like(p);
      }
      s.step += 1;
      auto grad = p.grad();
      if (weight_decay_ != 0) grad = grad.add(p, weight_decay_);
      s.exp_avg.lerp_(grad, 1 - kBeta1);
      s.exp_avg_sq.mul_(kBeta2).addcmul_(grad, grad, 1 - kBeta2);
      const double bias_correction1 = 1 - std::pow(kBeta1, s.step);
      const double bias_correction2 = 1 - std::pow(kBeta2, s.step);
      const double step_size = lr_ / bias_correction1;
      const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);
      auto denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(kEps);
      p.addcdiv_(s.exp_avg, denom, -step_size);
    }
    return {};
  }

 private:
  static constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  struct Moments {
    double step = 0;
    torch::Tensor exp_avg, exp_avg_sq;
  };
  double lr_, weight_decay_;
  std::map<const void*, Moments> moments_;
};
#endif

json logging_json(const c10::DDPLoggingData& data, const json& keys) {
  json out = json::object();
  for (const auto& k : keys) {
    const std::string key = k;
    if (auto it = data.ints_map.find(key); it != data.ints_map.end()) {
      out[key] = it->second;
    } else if (auto st = data.strs_map.find(key); st != data.strs_map.end()) {
      out[key] = st->second;
    } else {
      out[key] = nullptr;
    }
  }
  return out;
}

struct Result {
  json facts = json::object();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

// Where this rank runs: parity.py's placement() (DDPRUN_PARITY_DEVICE, DDPRUN_PARITY_BACKEND).
std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

torch::Device placement_device() {
  if (env_or("DDPRUN_PARITY_DEVICE", "cpu") != "cuda") return torch::kCPU;
  const auto local_rank = std::stoi(env_or("LOCAL_RANK", "0"));
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % static_cast<int>(torch::cuda::device_count()))};
}

Result train(const json& c, const std::string& dir, int rank, const std::string& reducer) {
  const json& m = c.at("model");
  const json& o = c.at("ddp");
  const torch::Device device = placement_device();
  auto dist = Distributed::init(
      InitOptions().backend(env_or("DDPRUN_PARITY_BACKEND", "gloo")).timeout(std::chrono::seconds(60)));
  Net net(m, rank);
  if (!m.at("mismatch").get<bool>()) {
    auto init = read_tensors(dir + "/init");
    torch::NoGradGuard no_grad;
    for (auto& item : net->named_parameters()) item.value().copy_(init.at(item.key()));
    for (auto& item : net->named_buffers()) item.value().copy_(init.at(item.key()));
  }
  if (c.at("rank_buffers").get<bool>()) {
    torch::NoGradGuard no_grad;
    net->bn->running_mean.add_(rank);
  }
  set_sync_batch_norm_group(*net, dist.c10d_group());
  net->to(device);

  DdpOptions options;
  options.broadcast_buffers(o.at("broadcast_buffers"));
  options.find_unused_parameters(o.at("find_unused_parameters"));
  options.gradient_as_bucket_view(o.at("gradient_as_bucket_view"));
  options.static_graph(o.at("static_graph"));
  options.direct_gloo(reducer != "process-group");
  const size_t first = o.at("first_bucket_bytes");
  if (!o.at("bucket_cap_mb").is_null()) {
    options.bucket_cap_bytes(static_cast<size_t>(o.at("bucket_cap_mb").get<double>() * (1 << 20)));
  }
  // torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: read by 1.x always, by 2.x only without bucket_cap_mb.
  if (TORCH_VERSION_MAJOR < 2 || o.at("bucket_cap_mb").is_null()) options.first_bucket_cap_bytes(first);
  DistributedDataParallel<NetImpl> ddp(net, dist, options);
  std::optional<PeriodicModelAverager> averager;
  if (c.at("hook") == "powersgd") {
    const json& a = c.at("powersgd");
    // Python's defaults are PowerSGDOptions' own: only what the case sets is passed on.
    comm_hooks::PowerSGDOptions options;
    if (a.contains("matrix_approximation_rank")) options.matrix_approximation_rank(a.at("matrix_approximation_rank"));
    if (a.contains("start_powerSGD_iter")) options.start_powerSGD_iter(a.at("start_powerSGD_iter"));
    if (a.contains("min_compression_rate")) options.min_compression_rate(a.at("min_compression_rate"));
    if (a.contains("use_error_feedback")) options.use_error_feedback(a.at("use_error_feedback"));
    if (a.contains("warm_start")) options.warm_start(a.at("warm_start"));
    if (a.contains("orthogonalization_epsilon")) options.orthogonalization_epsilon(a.at("orthogonalization_epsilon"));
    if (a.contains("random_seed")) options.random_seed(a.at("random_seed"));
    if (a.contains("batch_tensors_with_same_shape"))
      options.batch_tensors_with_same_shape(a.at("batch_tensors_with_same_shape"));
    auto state = std::make_shared<comm_hooks::PowerSGDState>(ddp.process_group(), options);
    ddp.register_comm_hook(state, comm_hooks::powerSGD_hook, "powerSGD_hook");
  } else if (c.at("hook") == "post_localsgd") {
    const json& a = c.at("local_sgd");
    auto state = std::make_shared<comm_hooks::PostLocalSGDState>(
        ddp.process_group(), dist.new_subgroups(a.at("subgroup_size")), a.at("start_localSGD_iter"));
    ddp.register_comm_hook(state, comm_hooks::post_localSGD_hook, "post_localSGD_hook");
    averager.emplace(a.at("period"), a.at("warmup_steps"), dist.c10d_group());
  } else if (c.at("hook") == "bf16") {
    // parity.py's name for bf16_compress_hook (Python's own refuses to run without CUDA).
    ddp.register_comm_hook(ddp.process_group(), comm_hooks::bf16_compress_hook, "bf16_compress_hook_gloo");
  } else if (!c.at("hook").is_null()) {
    ddp.register_comm_hook(comm_hooks::parse_builtin(c.at("hook")));
  }

  // Each parameter once, as Python's parameters() gives them (LibTorch's lists a tied one twice,
  // and an optimizer would step it twice).
  std::vector<torch::Tensor> params;
  for (const auto& [name, p] : unique(net->named_parameters())) params.push_back(p);
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<ZeroRedundancyOptimizer<torch::optim::SGD>> zero;
  const auto sgd_options = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4);
  if (c.at("optimizer") == "sgd") {
    opt = std::make_unique<torch::optim::SGD>(params, sgd_options);
  } else if (c.at("optimizer") == "zero_sgd") {
    zero = std::make_unique<ZeroRedundancyOptimizer<torch::optim::SGD>>(params, sgd_options, dist.c10d_group());
  } else {
#if TORCH_VERSION_MAJOR >= 2
    opt = std::make_unique<PythonAdam>(params, 1e-3, 1e-2);
#else
    // 1.13: LibTorch's Adam is Python's, operation for operation.
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3).weight_decay(1e-2));
#endif
  }
  auto data = read_tensors(dir + "/data");
  auto xs = data.at("x").to(device);
  auto ys = data.at("y").to(torch::kLong).to(device);
  int64_t next = 0;
  auto loss_of = [&](int64_t i) { return torch::nn::functional::cross_entropy(ddp(xs[i][rank]), ys[i][rank]); };

  const std::string schedule = c.at("schedule");
  if (schedule == "detail_mismatch") {
    auto t = torch::ones({3 + rank}, device);
    dist.all_reduce_sum(t);
    throw std::runtime_error("the all-reduce of tensors of different sizes did not fail");
  }
  const bool set_to_none = c.at("set_to_none");
  const json& j = c.at("join");
  const int steps = c.at("steps").get<int>() + (schedule == "join" ? j.at("extra").get<int>() * rank : 0);
  auto one_step = [&](int step) {
    zero_grad(params, set_to_none);
    if (schedule == "train" || schedule == "join") {
      loss_of(next++).backward();
    } else if (schedule == "accum") {
      {
        auto guard = ddp.no_sync();
        loss_of(next++).backward();
        loss_of(next++).backward();
      }
      loss_of(next++).backward();
    } else if (schedule == "split_out") {
      auto loss = loss_of(next++);
      auto guard = ddp.no_sync();
      loss.backward();
    } else if (schedule == "split_in") {
      torch::Tensor loss;
      {
        auto guard = ddp.no_sync();
        loss = loss_of(next++);
      }
      loss.backward();
    } else if (schedule == "eval_uneven") {
      loss_of(next++).backward();
      if (step == 0) {
        ddp.eval();
        {
          torch::NoGradGuard no_grad;
          const int64_t first_batch = next;
          next += c.at("world").get<int>() + 1;
          for (int k = 0; k <= rank; ++k) ddp(xs[first_batch + k][rank]);
        }
        dist.barrier();
        ddp.train();
      }
    } else {
      throw std::invalid_argument("unknown schedule " + schedule);
    }
    if (zero) {
      zero->step();
    } else {
      opt->step();
    }
    if (averager) averager->average_parameters(params);
  };
  auto loop = [&] {
    for (int step = 0; step < steps; ++step) one_step(step);
  };
  if (schedule == "join") {
    JoinOptions join_options;
    join_options.throw_on_early_termination(j.at("throw"));
    join_options.divide_by_initial_world_size(j.at("divide_by_initial_world_size"));
    if (zero) {
      Join({ddp, *zero}, join_options).run(loop);  // Python: with Join([ddp, zero], ...)
    } else {
      ddp.join(loop, join_options);  // Python: with ddp.join(...)
    }
  } else {
    loop();
  }

  Result result;
  result.facts["logging"] = logging_json(ddp.logging_data(), c.at("logging_keys"));
  result.facts["grad_views"] = json::object();
  for (const auto& [name, p] : unique(net->named_parameters())) {
    if (p.grad().defined()) result.facts["grad_views"][name] = p.grad().is_view();
    result.tensors.emplace_back("param/" + name, p);
    result.tensors.emplace_back("grad/" + name, p.grad());
  }
  for (const auto& [name, b] : unique(net->named_buffers())) result.tensors.emplace_back("buffer/" + name, b);
  dist.barrier();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: parity_worker DIR OUT [direct|process-group]\n";
    return 2;
  }
  const std::string dir = argv[1], out = argv[2], reducer = argc > 3 ? argv[3] : "direct";
  torch::set_num_threads(1);
  const int rank = std::stoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  std::filesystem::create_directories(out);
  const std::string prefix = out + "/rank" + std::to_string(rank);
  std::ifstream case_in(dir + "/case.json");
  const json c = json::parse(case_in);
  try {
    Result r = train(c, dir, rank, reducer);
    write_tensors(prefix, r.tensors, r.facts);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    write_tensors(prefix, {}, {{"error", e.what()}});
    return 1;
  }
}
