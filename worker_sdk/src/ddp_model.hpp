#pragma once
// What DistributedDataParallel reads of a module and checks across ranks, as Python DDP does:
// the module tree walked as named_modules() walks it, parameters and buffers once each (a tied
// tensor under its first name), the reducer's parameters, and the construction-time check that
// every rank built the same model. Thread-safety: none needed (construction and error paths).

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::worker::detail {

struct NamedTensor {
  std::string name;  // fully qualified: "fc1.weight"
  at::Tensor tensor;
};

// Each module of the tree once, with its qualified name, in pre-order as Python's named_modules()
// (which also skips a module met a second time). The root comes first as ("", nullptr).
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules_once(torch::nn::Module& root);

// Parameters (buffers: `buffers`) once each, first name wins, as Python's named_parameters() and
// named_buffers() (remove_duplicate=True).
std::vector<NamedTensor> unique_tensors(torch::nn::Module& root, bool buffers);

struct ReducerParameter {
  std::string name;
  at::Tensor tensor;
  bool sparse_gradient = false;  // a sparse Embedding's or EmbeddingBag's weight
};
// _build_params_for_reducer: the parameters that require a gradient and are not ignored, module by
// module, each once (tied parameters are reduced once).
std::vector<ReducerParameter> reducer_parameters(torch::nn::Module& root, const std::set<std::string>& ignored);

// _verify_param_shape_across_processes, reported on every rank (Python's raises on the ranks that
// differ from rank 0 and leaves rank 0 to fail later on a closed connection): every rank's
// parameter count, dtypes, sizes and strides against rank 0's. Collective. Throws
// std::runtime_error naming the first difference.
void verify_same_parameters(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::vector<at::Tensor>& params,
                            const std::vector<std::string>& names);

// The reducer names the parameters that got no gradient only with TORCH_DISTRIBUTED_DEBUG set, by
// index otherwise ("Parameter indices which did not receive grad for rank 0: 8 9"): adds the names
// to such a message (`names` in the reducer's order), whatever the debug level.
std::string with_parameter_names(std::string message, const std::vector<std::string>& names);

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpus();

}  // namespace ddprun::worker::detail
