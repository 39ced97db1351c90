// Module and optimizer state dicts in Python's layout (serialize.hpp): model.state_dict() with its
// _metadata versions, load_state_dict's strictness and resizable buffers, and optimizer.state_dict()
// for LibTorch's SGD, Adam and AdamW.
#include <ATen/core/Dict.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "ddprun/worker/serialize.hpp"
#include "ddprun/worker/sync_batch_norm.hpp"

namespace ddprun::worker {
namespace {

std::string strip_module_prefix(const std::string& name) {
  return name.rfind("module.", 0) == 0 ? name.substr(7) : name;
}

int64_t python_state_version(const torch::nn::Module& m) {
  if (const auto* v = dynamic_cast<const PythonStateVersion*>(&m)) return v->python_state_version();
  if (dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) ||
      dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m) || dynamic_cast<const SyncBatchNormImpl*>(&m)) {
    return 2;  // _BatchNorm._version
  }
  return 1;
}

c10::impl::GenericDict version_entry(int64_t version) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::IntType::get());
  d.insert("version", version);
  return d;
}

}  // namespace

c10::impl::GenericDict state_dict(const torch::nn::Module& model) {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : model.named_parameters()) state.insert(item.key(), item.value().detach());
  for (const auto& item : model.named_buffers()) state.insert(item.key(), item.value().detach());
  c10::impl::GenericDict metadata(c10::StringType::get(), c10::AnyType::get());
  metadata.insert("", version_entry(python_state_version(model)));
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    metadata.insert(item.key(), version_entry(python_state_version(*item.value())));
  }
  state.insert("_metadata", metadata);
  return state;
}

void load_state_dict(torch::nn::Module& model, const c10::IValue& state, bool strict) {
  if (!state.isGenericDict())
    throw std::runtime_error("a model's state dict must be a dict of tensors, not a " + state.tagKind());
  std::map<std::string, at::Tensor> saved;
  std::vector<std::string> unexpected, missing, mismatched;
  for (const auto& kv : state.toGenericDict()) {
    if (kv.key().isString() && kv.key().toStringRef() == "_metadata") continue;  // Python's layout versions
    if (!kv.key().isString() || !kv.value().isTensor()) {
      throw std::runtime_error("a model's state dict must map names to tensors; it holds a " + kv.key().tagKind() +
                               " -> " + kv.value().tagKind() + " entry");
    }
    saved[strip_module_prefix(kv.key().toStringRef())] = kv.value().toTensor();
  }
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (auto& item : model.named_parameters()) targets.emplace_back(item.key(), item.value());
  for (auto& item : model.named_buffers()) targets.emplace_back(item.key(), item.value());
  // The buffers that take the state dict's shapes (ResizableBuffers).
  std::set<std::string> resizable;
  auto note_resizable = [&](const std::string& prefix, const torch::nn::Module& m) {
    if (!dynamic_cast<const ResizableBuffers*>(&m)) return;
    for (const auto& b : m.named_buffers(/*recurse=*/false)) resizable.insert(strip_module_prefix(prefix + b.key()));
  };
  note_resizable("", model);
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    note_resizable(item.key() + ".", *item.value());
  std::set<std::string> known;
  for (const auto& [raw, target] : targets) {
    const std::string name = strip_module_prefix(raw);
    known.insert(name);
    auto it = saved.find(name);
    if (it == saved.end()) {
      missing.push_back(name);
    } else if (it->second.sizes() != target.sizes() && !resizable.count(name)) {
      std::ostringstream msg;
      msg << name << " (" << it->second.sizes() << " in the state dict, " << target.sizes() << " in the model)";
      mismatched.push_back(msg.str());
    }
  }
  for (const auto& kv : saved) {
    if (!known.count(kv.first)) unexpected.push_back(kv.first);
  }
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::string msg = "the state dict does not fit the model:";
    auto list = [&](const char* what, const std::vector<std::string>& names) {
      if (names.empty()) return;
      msg += std::string(" ") + what + ":";
      for (size_t i = 0; i < names.size(); ++i) msg += (i ? ", " : " ") + names[i];
      msg += ".";
    };
    list("missing", strict ? missing : std::vector<std::string>{});
    list("unexpected", strict ? unexpected : std::vector<std::string>{});
    list("shape mismatch", mismatched);
    throw std::runtime_error(msg);
  }
  torch::NoGradGuard no_grad;
  for (auto& [raw, target] : targets) {
    auto it = saved.find(strip_module_prefix(raw));
    if (it == saved.end()) continue;
    if (it->second.sizes() != target.sizes()) target.resize_(it->second.sizes());  // a ResizableBuffers' buffer
    target.copy_(it->second);  // onto the model's own device and dtype
  }
}

namespace {

enum class OptimKind { kSgd, kAdam, kAdamW };

OptimKind kind_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return OptimKind::kSgd;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return OptimKind::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return OptimKind::kAdam;
  throw std::invalid_argument(
      "optimizer state dicts in Python's layout are made for torch::optim::SGD, Adam and AdamW; this optimizer is "
      "another (save_checkpoint keeps its state in LibTorch's own format only for those three)");
}

// The optimizer's state is keyed by the parameter's TensorImpl: as a string on 1.x, a pointer on 2.x.
template <class Map>
typename Map::key_type state_key(const Map&, const at::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;  // as c10::guts::to_string writes a pointer
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

c10::IValue betas(const std::tuple<double, double>& b) {
  return c10::ivalue::Tuple::create({std::get<0>(b), std::get<1>(b)});
}

// The hyperparameters of a group, with the keys PyTorch 2.6's optimizer has (1.13's reads them too).
void write_group(OptimKind kind, const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& g) {
  if (kind == OptimKind::kSgd) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
    g.insert("lr", o.lr());
    g.insert("momentum", o.momentum());
    g.insert("dampening", o.dampening());
    g.insert("weight_decay", o.weight_decay());
    g.insert("nesterov", o.nesterov());
    g.insert("maximize", false);
    g.insert("foreach", c10::IValue());
    g.insert("differentiable", false);
    g.insert("fused", c10::IValue());
    return;
  }
  auto common = [&](double lr, const std::tuple<double, double>& b, double eps, double wd, bool amsgrad) {
    g.insert("lr", lr);
    g.insert("betas", betas(b));
    g.insert("eps", eps);
    g.insert("weight_decay", wd);
    g.insert("amsgrad", amsgrad);
    g.insert("maximize", false);
    g.insert("foreach", c10::IValue());
    g.insert("capturable", false);
    g.insert("differentiable", false);
    g.insert("fused", c10::IValue());
  };
  if (kind == OptimKind::kAdam) {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(options);
    common(o.lr(), o.betas(), o.eps(), o.weight_decay(), o.amsgrad());
  } else {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(options);
    common(o.lr(), o.betas(), o.eps(), o.weight_decay(), o.amsgrad());
  }
}

template <class State>
c10::impl::GenericDict adam_state(const State& s) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  // Python keeps the step count as a float32 scalar tensor (1.12 on).
  d.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
  d.insert("exp_avg", s.exp_avg().detach());
  d.insert("exp_avg_sq", s.exp_avg_sq().detach());
  if (s.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", s.max_exp_avg_sq().detach());
  return d;
}

c10::IValue param_state(OptimKind kind, const torch::optim::OptimizerParamState& state) {
  switch (kind) {
    case OptimKind::kSgd: {
      c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
      const auto& buf = static_cast<const torch::optim::SGDParamState&>(state).momentum_buffer();
      d.insert("momentum_buffer", buf.defined() ? c10::IValue(buf.detach()) : c10::IValue());
      return d;
    }
    case OptimKind::kAdam: return adam_state(static_cast<const torch::optim::AdamParamState&>(state));
    case OptimKind::kAdamW: return adam_state(static_cast<const torch::optim::AdamWParamState&>(state));
  }
  return {};
}

[[noreturn]] void bad_optimizer_state(const std::string& why) {
  throw std::runtime_error("the optimizer state dict does not fit this optimizer: " + why);
}

// (a copy: IValues are handles, and a reference would outlive a temporary dict handle)
c10::IValue entry(const c10::impl::GenericDict& d, const char* key, const std::string& where) {
  auto it = d.find(key);
  if (it == d.end()) bad_optimizer_state(where + " has no '" + key + "'");
  return it->value();
}

double number(const c10::impl::GenericDict& d, const char* key, const std::string& where) {
  const c10::IValue v = entry(d, key, where);
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();  // lr as a tensor (2.x)
  bad_optimizer_state(where + "'s '" + key + "' is a " + v.tagKind() + ", not a number");
}

bool flag(const c10::impl::GenericDict& d, const char* key, const std::string& where, bool otherwise) {
  auto it = d.find(key);
  if (it == d.end() || it->value().isNone()) return otherwise;
  if (!it->value().isBool()) bad_optimizer_state(where + "'s '" + key + "' is not a bool");
  return it->value().toBool();
}

std::tuple<double, double> read_betas(const c10::impl::GenericDict& d, const std::string& where) {
  const c10::IValue v = entry(d, "betas", where);
  std::vector<double> b;
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements())
      b.push_back(e.isInt() ? static_cast<double>(e.toInt()) : e.toDouble());
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) b.push_back(e.isInt() ? static_cast<double>(e.toInt()) : e.toDouble());
  }
  if (b.size() != 2) bad_optimizer_state(where + "'s 'betas' is not a pair of numbers");
  return {b[0], b[1]};
}

void read_group(OptimKind kind, const c10::impl::GenericDict& g, torch::optim::OptimizerOptions& options,
                const std::string& where) {
  if (flag(g, "maximize", where, false))
    bad_optimizer_state(where + " has maximize=True, which LibTorch's optimizers lack");
  if (kind == OptimKind::kSgd) {
    auto& o = static_cast<torch::optim::SGDOptions&>(options);
    o.lr(number(g, "lr", where)).momentum(number(g, "momentum", where)).dampening(number(g, "dampening", where));
    o.weight_decay(number(g, "weight_decay", where)).nesterov(flag(g, "nesterov", where, false));
    return;
  }
  auto apply = [&](auto& o) {
    o.lr(number(g, "lr", where)).betas(read_betas(g, where)).eps(number(g, "eps", where));
    o.weight_decay(number(g, "weight_decay", where)).amsgrad(flag(g, "amsgrad", where, false));
  };
  if (kind == OptimKind::kAdam) {
    apply(static_cast<torch::optim::AdamOptions&>(options));
  } else {
    apply(static_cast<torch::optim::AdamWOptions&>(options));
  }
}

at::Tensor state_tensor(const c10::impl::GenericDict& d, const char* key, const at::Tensor& param,
                        const std::string& where) {
  const c10::IValue v = entry(d, key, where);
  if (!v.isTensor()) bad_optimizer_state(where + "'s '" + key + "' is not a tensor");
  const at::Tensor& t = v.toTensor();
  if (t.sizes() != param.sizes()) {
    std::ostringstream msg;
    msg << where << "'s '" << key << "' has shape " << t.sizes() << " but its parameter " << param.sizes();
    bad_optimizer_state(msg.str());
  }
  // As Python's load_state_dict: onto the parameter's device, in its (floating) dtype.
  return t.to(param.device(), param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
}

template <class State>
std::unique_ptr<torch::optim::OptimizerParamState> read_adam_state(const c10::impl::GenericDict& d, const at::Tensor& p,
                                                                   const std::string& where) {
  auto s = std::make_unique<State>();
  s->step(static_cast<int64_t>(std::llround(number(d, "step", where))));
  s->exp_avg(state_tensor(d, "exp_avg", p, where));
  s->exp_avg_sq(state_tensor(d, "exp_avg_sq", p, where));
  if (d.contains("max_exp_avg_sq")) s->max_exp_avg_sq(state_tensor(d, "max_exp_avg_sq", p, where));
  return s;
}

}  // namespace

c10::impl::GenericDict state_dict(const torch::optim::Optimizer& optimizer) {
  const OptimKind kind = kind_of(optimizer);
  const auto& states = optimizer.state();
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    c10::impl::GenericDict g(c10::StringType::get(), c10::AnyType::get());
    write_group(kind, group.options(), g);
    c10::impl::GenericList params(c10::AnyType::get());
    for (const auto& p : group.params()) {
      auto it = states.find(state_key(states, p));
      if (it != states.end()) state.insert(index, param_state(kind, *it->second));
      params.push_back(index++);
    }
    g.insert("params", params);
    groups.push_back(g);
  }
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void load_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& saved) {
  const OptimKind kind = kind_of(optimizer);
  if (!saved.isGenericDict()) bad_optimizer_state("it is a " + saved.tagKind() + ", not a dict");
  const auto root = saved.toGenericDict();
  const c10::IValue groups_v = entry(root, "param_groups", "it");
  const c10::IValue state_v = entry(root, "state", "it");
  if (!groups_v.isList() || !state_v.isGenericDict())
    bad_optimizer_state("'param_groups' or 'state' is of the wrong type");
  const auto groups = groups_v.toList();
  auto& mine = optimizer.param_groups();
  if (groups.size() != mine.size()) {
    bad_optimizer_state("it has " + std::to_string(groups.size()) + " parameter groups, the optimizer " +
                        std::to_string(mine.size()));
  }
  // Check everything before changing anything: a state dict that does not fit leaves the optimizer as it was.
  std::map<int64_t, at::Tensor> param_of;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const std::string where = "parameter group " + std::to_string(gi);
    const c10::IValue gv = groups.get(gi);
    if (!gv.isGenericDict()) bad_optimizer_state(where + " is not a dict");
    const c10::IValue params = entry(gv.toGenericDict(), "params", where);
    if (!params.isList()) bad_optimizer_state(where + "'s 'params' is not a list");
    const auto ids = params.toListRef();
    if (ids.size() != mine[gi].params().size()) {
      bad_optimizer_state(where + " has " + std::to_string(ids.size()) + " parameters, the optimizer's " +
                          std::to_string(mine[gi].params().size()));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].isInt()) bad_optimizer_state(where + "'s 'params' holds something not an index");
      param_of[ids[i].toInt()] = mine[gi].params()[i];
    }
  }
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
  for (const auto& kv : state_v.toGenericDict()) {
    if (!kv.key().isInt() || !param_of.count(kv.key().toInt()))
      bad_optimizer_state("its state names a parameter it does not list");
    if (!kv.value().isGenericDict()) bad_optimizer_state("the state of a parameter is not a dict");
    const auto d = kv.value().toGenericDict();
    const at::Tensor& p = param_of.at(kv.key().toInt());
    const std::string where = "the state of parameter " + std::to_string(kv.key().toInt());
    std::unique_ptr<torch::optim::OptimizerParamState> s;
    switch (kind) {
      case OptimKind::kSgd: {
        auto it = d.find("momentum_buffer");
        if (it == d.end() || it->value().isNone()) continue;  // SGD without momentum keeps none
        auto sgd = std::make_unique<torch::optim::SGDParamState>();
        sgd->momentum_buffer(state_tensor(d, "momentum_buffer", p, where));
        s = std::move(sgd);
        break;
      }
      case OptimKind::kAdam: s = read_adam_state<torch::optim::AdamParamState>(d, p, where); break;
      case OptimKind::kAdamW: s = read_adam_state<torch::optim::AdamWParamState>(d, p, where); break;
    }
    states.emplace_back(p, std::move(s));
  }
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    auto options = mine[gi].options().clone();
    read_group(kind, groups.get(gi).toGenericDict(), *options, "parameter group " + std::to_string(gi));
    mine[gi].set_options(std::move(options));
  }
  auto& live = optimizer.state();
  live.clear();
  for (auto& [p, s] : states) live[state_key(live, p)] = std::move(s);
}

}  // namespace ddprun::worker
