#include "ddp_model.hpp"

#include <torch/nn/modules/embedding.h>

#include <sched.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "ddprun/worker/progress.hpp"

namespace ddprun::worker::detail {
namespace {

std::string qualified(const std::string& module, const std::string& name) {
  return module.empty() ? name : module + "." + name;
}

}  // namespace

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules_once(torch::nn::Module& root) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  std::unordered_set<const torch::nn::Module*> seen{&root};
  out.emplace_back("", nullptr);  // the root itself (not owned here)
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (seen.insert(item.value().get()).second) out.emplace_back(item.key(), item.value());
  }
  return out;
}

std::vector<NamedTensor> unique_tensors(torch::nn::Module& root, bool buffers) {
  std::vector<NamedTensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& [prefix, module] : modules_once(root)) {
    torch::nn::Module& m = module ? *module : root;
    auto items = buffers ? m.named_buffers(false) : m.named_parameters(false);
    for (const auto& item : items) {
      if (!item.value().defined()) continue;
      if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
        out.push_back({qualified(prefix, item.key()), item.value()});
      }
    }
  }
  return out;
}

std::vector<ReducerParameter> reducer_parameters(torch::nn::Module& root, const std::set<std::string>& ignored) {
  std::vector<ReducerParameter> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& [prefix, owned] : modules_once(root)) {
    torch::nn::Module& m = owned ? *owned : root;
    bool sparse = false;
    if (auto* e = dynamic_cast<torch::nn::EmbeddingImpl*>(&m)) sparse = e->options.sparse();
    if (auto* e = dynamic_cast<torch::nn::EmbeddingBagImpl*>(&m)) sparse = e->options.sparse();
    for (const auto& item : m.named_parameters(false)) {
      std::string name = qualified(prefix, item.key());
      const at::Tensor& p = item.value();
      if (!p.defined() || !p.requires_grad() || ignored.count(name)) continue;
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // tied: reduced once
      out.push_back({std::move(name), p, sparse});
    }
  }
  return out;
}

void verify_same_parameters(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::vector<at::Tensor>& params,
                            const std::vector<std::string>& names) {
  const int world = pg->getSize();
  if (world == 1) return;
  std::vector<int64_t> mine{static_cast<int64_t>(params.size())};
  for (const auto& p : params) {
    mine.push_back(static_cast<int64_t>(p.scalar_type()));
    mine.push_back(p.dim());
    for (auto d : p.sizes()) mine.push_back(d);
    for (auto d : p.strides()) mine.push_back(d);
  }
  const auto device = params.front().device();
  auto gather = [&](const at::Tensor& t) {
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < world; ++r) out[0].push_back(torch::empty_like(t));
    std::vector<at::Tensor> in{t};
    CollectiveWait waiting;
    pg->allgather(out, in)->wait();
    return out[0];
  };
  const auto lengths = gather(torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong).to(device));
  int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.cpu().item<int64_t>());
  auto padded = torch::full({longest}, -1, torch::kLong);
  std::copy(mine.begin(), mine.end(), padded.data_ptr<int64_t>());
  const auto all = gather(padded.to(device));

  auto describe = [](const int64_t*& it, int64_t dim) {
    std::string s = "[";
    for (int64_t d = 0; d < dim; ++d) s += (d ? ", " : "") + std::to_string(*it++);
    return s + "]";
  };
  const auto zero = all[0].cpu();
  for (int r = 1; r < world; ++r) {
    const auto other = all[static_cast<size_t>(r)].cpu();
    const int64_t* a = zero.data_ptr<int64_t>();
    const int64_t* b = other.data_ptr<int64_t>();
    const int64_t count_a = *a++, count_b = *b++;
    std::string problem;
    for (int64_t i = 0; i < std::min(count_a, count_b) && problem.empty(); ++i) {
      const int64_t dtype_a = *a++, dtype_b = *b++, dim_a = *a++, dim_b = *b++;
      const std::string sizes_a = describe(a, dim_a), sizes_b = describe(b, dim_b);
      const std::string strides_a = describe(a, dim_a), strides_b = describe(b, dim_b);
      const std::string which =
          "params[" + std::to_string(i) + "]" +
          (static_cast<size_t>(i) < names.size() ? " (" + names[static_cast<size_t>(i)] + " here)" : "");
      if (sizes_a != sizes_b) {
        problem = which + " in process " + std::to_string(r) + " with sizes " + sizes_b +
                  " appears not to match sizes of the same param in process 0, " + sizes_a;
      } else if (strides_a != strides_b) {
        problem = which + " in process " + std::to_string(r) + " with strides " + strides_b +
                  " appears not to match strides of the same param in process 0, " + strides_a;
      } else if (dtype_a != dtype_b) {
        problem = which + " in process " + std::to_string(r) + " has dtype " +
                  c10::toString(static_cast<c10::ScalarType>(dtype_b)) + ", in process 0 " +
                  c10::toString(static_cast<c10::ScalarType>(dtype_a));
      }
    }
    if (problem.empty() && count_a != count_b) {
      problem = "process " + std::to_string(r) + " has " + std::to_string(count_b) +
                " parameters that require a gradient, process 0 has " + std::to_string(count_a);
    }
    if (!problem.empty()) {
      throw std::runtime_error("DistributedDataParallel: the ranks' models differ: " + problem +
                               ". Every rank must build the same model (same layers, sizes and order).");
    }
  }
}

std::string with_parameter_names(std::string message, const std::vector<std::string>& names) {
  const std::string marker = "Parameter indices which did not receive grad for rank ";
  const auto at = message.find(marker);
  if (at == std::string::npos) return message;
  const auto colon = message.find(':', at + marker.size());
  if (colon == std::string::npos) return message;
  const auto line_end = message.find('\n', colon);
  std::istringstream indices(
      message.substr(colon + 1, line_end == std::string::npos ? std::string::npos : line_end - colon - 1));
  std::string listed;
  for (size_t i = 0; indices >> i;) {
    if (i < names.size()) listed += (listed.empty() ? "" : ", ") + names[i];
  }
  if (listed.empty()) return message;
  const std::string addition = "\nTheir names: " + listed + ".";
  if (line_end == std::string::npos) return message + addition;
  return message.insert(line_end, addition);
}

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace ddprun::worker::detail
