#include "ddprun/worker/checkpoint.hpp"

#include <ATen/core/Dict.h>
#include <torch/serialize/input-archive.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/replace_file.hpp"
#include "ddprun/worker/progress.hpp"
#include "ddprun/worker/serialize.hpp"

namespace ddprun::worker {
namespace {

// Replaces `target` with `data` durably (common/replace_file.hpp): a crash at any moment leaves
// either the old file or the new one, whole, and the new one survives a power loss once this
// returns.
void write_durably(const std::filesystem::path& target, const std::vector<char>& data) {
  ReplaceFile how;
  how.create_directory = true;
  // Last moment before publishing: a node whose ddprun has not renewed its place in the job (frozen,
  // stopped, cut off) may have been replaced by a group re-formed without it, whose checkpoints
  // this one must not overwrite.
  how.before_publish = [&target]() -> std::optional<std::string> {
    const auto lapsed = membership_lapsed();
    if (!lapsed) return std::nullopt;
    return "not publishing checkpoint " + target.string() + ": this node's place in the job lapsed " +
           std::to_string(lapsed->count()) +
           " ms ago (its ddprun was frozen, stopped or cut off from the rendezvous), so the other nodes may have "
           "gone on without it; the previous checkpoint is kept";
  };
  if (const auto failed = replace_file(target.string(), std::string_view(data.data(), data.size()), how)) {
    if (failed->err == 0) throw std::runtime_error(failed->step);
    throw std::runtime_error("cannot write checkpoint " + target.string() + ": " + failed->what());
  }
}

}  // namespace

void torch_save(const c10::IValue& value, const std::string& path) { write_durably(path, torch_save_bytes(value)); }

void save_checkpoint(const std::string& path, const torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                     int64_t epoch, Distributed& dist) {
  if (dist.is_main()) {
    c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
    root.insert("model", state_dict(model));
    if (optimizer) root.insert("optimizer", state_dict(*optimizer));
    root.insert("epoch", epoch);
    root.insert("world_size", static_cast<int64_t>(dist.world_size()));
    torch_save(root, path);
  }
  dist.barrier();
}

namespace {

bool all_tensors(const c10::impl::GenericDict& d) {
  for (const auto& kv : d) {
    if (kv.key().isString() && kv.key().toStringRef() == "_metadata") continue;
    if (!kv.key().isString() || !kv.value().isTensor()) return false;
  }
  return true;
}

const c10::IValue* first_of(const c10::impl::GenericDict& d, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    auto it = d.find(k);
    if (it != d.end()) return &it->value();
  }
  return nullptr;
}

}  // namespace

std::optional<int64_t> load_checkpoint(const std::string& path, torch::nn::Module& model,
                                       torch::optim::Optimizer* optimizer) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  c10::optional<torch::Device> device;  // map_location: this rank's own device (the model's)
  for (const auto& p : model.parameters()) {
    device = p.device();
    break;
  }
  const c10::IValue loaded = torch_load(path);
  if (!loaded.isGenericDict())
    throw std::runtime_error("checkpoint " + path + " is a " + loaded.tagKind() + ", not a dict");
  const auto root = loaded.toGenericDict();
  auto in_file = [&](const std::exception& e) { return std::runtime_error("checkpoint " + path + ": " + e.what()); };
  // torch.save(model.state_dict()) or torch.save(ddp.state_dict()): the model alone.
  if (all_tensors(root) && !root.contains("model")) {
    try {
      load_state_dict(model, loaded);
    } catch (const std::exception& e) {
      throw in_file(e);
    }
    return 0;
  }
  // {"model": ..., "optimizer": ..., "epoch": ...}, as save_checkpoint writes, or the names of
  // PyTorch's tutorial on checkpoints ("model_state_dict", "optimizer_state_dict").
  const c10::IValue* model_state = first_of(root, {"model", "model_state_dict", "state_dict"});
  if (!model_state) {
    throw std::runtime_error("checkpoint " + path +
                             " holds neither a state dict nor a dict with one under 'model', "
                             "'model_state_dict' or 'state_dict'");
  }
  try {
    load_state_dict(model, *model_state);
  } catch (const std::exception& e) {
    throw in_file(e);
  }
  const c10::IValue* optim_state = first_of(root, {"optimizer", "optimizer_state_dict"});
  if (optimizer && optim_state) {
    try {
      if (optim_state->isTensor()) {
        // LibTorch's own archive, as earlier ddprun checkpoints hold it.
        const at::Tensor raw = optim_state->toTensor().contiguous();
        torch::serialize::InputArchive archive;
        archive.load_from(static_cast<const char*>(raw.data_ptr()), static_cast<size_t>(raw.numel()), device);
        optimizer->load(archive);
      } else {
        load_state_dict(*optimizer, *optim_state);
      }
    } catch (const std::exception& e) {
      throw in_file(e);
    }
  }
  const c10::IValue* epoch = first_of(root, {"epoch"});
  return epoch && epoch->isInt() ? epoch->toInt() : 0;
}

}  // namespace ddprun::worker
