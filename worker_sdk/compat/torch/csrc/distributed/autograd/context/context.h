#pragma once
// Debian 12's libtorch-dev (LibTorch 1.13) installs torch/csrc/distributed/c10d/reducer.hpp but not
// the distributed-autograd headers it includes. Of this one, reducer.hpp needs two names: the
// pointer type of a member it never touches inline (ContextPtr) and the gradient callback type it
// checks its own against (DistAutogradContext::GradCallback). This file declares exactly those, as
// LibTorch 1.13 defines them; worker_sdk/CMakeLists.txt puts it on the SDK's private include path
// only when LibTorch lacks the real header. Nothing here is ever constructed or called.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::distributed::autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
  DistAutogradContext() = delete;
};

using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace torch::distributed::autograd
