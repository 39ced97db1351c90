#pragma once
// torch.save files and state dicts shared with Python, both ways.
//
// torch_load reads what Python's torch.save writes (the zip format PyTorch has used by default since
// 1.6): state dicts (OrderedDicts of tensors, "module."-prefixed ones of DDP included), optimizer
// state dicts, and dicts, lists and tuples of those with numbers, strings and None. It reads the
// same things torch.load(weights_only=True) does and nothing else: a file that holds any other
// Python object is refused with its name, never executed, and a malformed or hostile file is
// refused with a std::runtime_error saying what is wrong in it. (LibTorch's own C++ reader,
// torch::pickle_load, reads only what TorchScript writes: Python's state dicts fail in it.)
//
// torch_save writes a file Python's torch.load reads, with weights_only=True too (the default
// from PyTorch 2.6 on): plain dicts, lists and tuples, no TorchScript type tags.
//
// state_dict / load_state_dict move a module's or an optimizer's state in the layout Python's
// module.state_dict() and optimizer.state_dict() have, so a checkpoint made on either side resumes
// on the other:
//   model      {name: tensor} with the module's parameter and buffer names
//   optimizer  {"state": {index: {name: tensor}}, "param_groups": [{hyperparameters..., "params": [index...]}]}
//              for SGD ("momentum_buffer"), Adam and AdamW ("step", "exp_avg", "exp_avg_sq",
//              "max_exp_avg_sq" with amsgrad), indices counting the parameters of all groups in order.

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <vector>

namespace ddprun::worker {

// Reads a torch.save file; tensors land on `map_location` (the CPU by default), as torch.load's
// map_location puts them. Throws std::runtime_error naming the file and what is wrong with it.
c10::IValue torch_load(const std::string& path, std::optional<c10::Device> map_location = std::nullopt);
// The same from the bytes of a file (`what` names them in errors).
c10::IValue torch_load_bytes(const std::vector<char>& bytes, const std::string& what = "torch.save data",
                             std::optional<c10::Device> map_location = std::nullopt);

// The bytes of a torch.save file of `value` (tensors are saved from the CPU).
std::vector<char> torch_save_bytes(const c10::IValue& value);
// Writes them to `path` as a durable replace: a crash leaves the old file or the new one, whole.
void torch_save(const c10::IValue& value, const std::string& path);

// model.state_dict(): parameters and buffers by name, detached (they share the module's storage),
// and under "_metadata" each module's layout version, which torch_save writes as Python's
// OrderedDict state_dict()._metadata (and torch_load reads back to that key).
c10::impl::GenericDict state_dict(const torch::nn::Module& model);
// A module whose buffers take the shapes of the state dict they load, as Python's observers and
// fake quantizers do in their _load_from_state_dict (statistics per channel that exist only from
// the first batch on, scales that become one per channel): load_state_dict resizes them.
class ResizableBuffers {
 public:
  virtual ~ResizableBuffers() = default;
};

// A module whose Python counterpart has a layout version (its _version) other than 1: state_dict
// writes it in the dict's _metadata, as Python's does, for Python's load_state_dict to read the
// layout by (LibTorch's BatchNorm and ddprun's SyncBatchNorm count as 2 without saying so).
class PythonStateVersion {
 public:
  virtual ~PythonStateVersion() = default;
  virtual int64_t python_state_version() const = 0;
};

// model.load_state_dict(state, strict): copies each tensor into the module's own (onto its device
// and dtype). Names may carry DDP's "module." prefix; "_metadata" is not a tensor's. With `strict`, every name of the module must
// be in `state` and nothing else; a mismatched shape is always an error. The error lists every
// missing, unexpected and mis-shaped name, as Python's does.
void load_state_dict(torch::nn::Module& model, const c10::IValue& state, bool strict = true);

// optimizer.state_dict() for torch::optim::SGD, Adam and AdamW (std::invalid_argument for another).
c10::impl::GenericDict state_dict(const torch::optim::Optimizer& optimizer);
// optimizer.load_state_dict(state): hyperparameters and per-parameter state, as Python's replaces
// them; the state's tensors go to each parameter's device. Throws std::runtime_error when the
// groups or parameters do not match (their counts, or a state tensor's shape).
void load_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state);

}  // namespace ddprun::worker
