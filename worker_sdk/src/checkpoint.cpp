#include "ddprun/worker/checkpoint.hpp"

#include <ATen/core/Dict.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ddprun::worker {
namespace {

std::string strip_module_prefix(const std::string& name) {
  return name.rfind("module.", 0) == 0 ? name.substr(7) : name;
}

}  // namespace

void save_checkpoint(const std::string& path, const torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                     int64_t epoch, Distributed& dist) {
  if (dist.is_main()) {
    c10::Dict<std::string, at::Tensor> state;
    for (const auto& item : model.named_parameters()) state.insert(strip_module_prefix(item.key()), item.value().detach().cpu());
    for (const auto& item : model.named_buffers()) state.insert(strip_module_prefix(item.key()), item.value().detach().cpu());
    c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
    root.insert("model", state);
    root.insert("epoch", epoch);
    root.insert("world_size", static_cast<int64_t>(dist.world_size()));
    if (optimizer) {
      torch::serialize::OutputArchive archive;
      optimizer->save(archive);
      std::ostringstream bytes;
      archive.save_to(bytes);
      // Raw bytes as a uint8 tensor: a pickled str would have to be valid UTF-8 for Python.
      const std::string raw = bytes.str();
      root.insert("optimizer", torch::from_blob(const_cast<char*>(raw.data()), {static_cast<int64_t>(raw.size())},
                                                torch::kUInt8).clone());
    }
    const std::vector<char> data = torch::pickle_save(root);
    const std::filesystem::path target(path);
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
      out.flush();
      if (!out) throw std::runtime_error("cannot write checkpoint " + tmp);
    }
    std::filesystem::rename(tmp, target);
  }
  dist.barrier();
}

std::optional<int64_t> load_checkpoint(const std::string& path, torch::nn::Module& model,
                                       torch::optim::Optimizer* optimizer) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue loaded = torch::pickle_load(data);
  if (!loaded.isGenericDict()) throw std::runtime_error("checkpoint " + path + " is not a dictionary");
  const auto root = loaded.toGenericDict();
  if (!root.contains("model")) throw std::runtime_error("checkpoint " + path + " has no 'model' entry");
  std::map<std::string, at::Tensor> saved;
  for (const auto& kv : root.at("model").toGenericDict()) {
    saved[strip_module_prefix(kv.key().toStringRef())] = kv.value().toTensor();
  }
  torch::NoGradGuard no_grad;
  auto assign = [&](const std::string& raw_name, at::Tensor& target) {
    const std::string name = strip_module_prefix(raw_name);
    auto it = saved.find(name);
    if (it == saved.end()) throw std::runtime_error("checkpoint " + path + " has no tensor '" + name + "'");
    if (it->second.sizes() != target.sizes()) {
      std::ostringstream msg;
      msg << "checkpoint " << path << ": tensor '" << name << "' has shape " << it->second.sizes()
          << " but the model expects " << target.sizes();
      throw std::runtime_error(msg.str());
    }
    target.copy_(it->second);  // onto the model's own device
  };
  for (auto& item : model.named_parameters()) assign(item.key(), item.value());
  for (auto& item : model.named_buffers()) assign(item.key(), item.value());
  if (optimizer && root.contains("optimizer")) {
    const at::Tensor raw = root.at("optimizer").toTensor().contiguous();
    torch::serialize::InputArchive archive;
    archive.load_from(static_cast<const char*>(raw.data_ptr()), static_cast<size_t>(raw.numel()));
    optimizer->load(archive);
  }
  return root.contains("epoch") ? std::optional<int64_t>(root.at("epoch").toInt()) : std::optional<int64_t>(0);
}

}  // namespace ddprun::worker
