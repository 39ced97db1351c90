#include "ddprun/worker/checkpoint.hpp"

#include <ATen/core/Dict.h>
#include <torch/serialize/input-archive.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/unique_fd.hpp"
#include "ddprun/worker/progress.hpp"
#include "ddprun/worker/serialize.hpp"

namespace ddprun::worker {
namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path, int err) {
  throw std::runtime_error("cannot write checkpoint " + path.string() + ": " + what + ": " + std::strerror(err));
}

// Replaces `target` with `data` durably: a crash at any moment leaves either the old file or the
// new one, whole. The bytes go to a temporary file of a unique name in the same directory (two
// jobs saving to one path never share it), which is fsynced and closed (both checked) before it is
// renamed over the target; the directory is fsynced after, so the rename itself survives a crash.
void write_durably(const std::filesystem::path& target, const std::vector<char>& data) {
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create the checkpoint directory " + dir.string() + ": " + ec.message());
  std::string tmp = (dir / (target.filename().string() + ".tmp.XXXXXX")).string();
  UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (!fd) fail("creating a temporary file in " + dir.string(), target, errno);
  auto abandon = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    fail(what, target, err);
  };
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd.get(), p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      fd.reset();
      abandon("writing " + tmp, err);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) {
    const int err = errno;
    fd.reset();
    abandon("fsync of " + tmp, err);
  }
  if (fd.close() != 0) abandon("closing " + tmp, errno);
  // Last moment before publishing: a node whose ddprun has not renewed its place in the job (frozen,
  // stopped, cut off) may have been replaced by a group re-formed without it, whose checkpoints
  // this one must not overwrite.
  if (const auto lapsed = membership_lapsed()) {
    ::unlink(tmp.c_str());
    throw std::runtime_error("not publishing checkpoint " + target.string() + ": this node's place in the job lapsed " +
                             std::to_string(lapsed->count()) +
                             " ms ago (its ddprun was frozen, stopped or cut off "
                             "from the rendezvous), so the other nodes may have gone on without it; the previous "
                             "checkpoint is kept");
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) abandon("renaming " + tmp + " over it", errno);
  const UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd) fail("opening its directory to fsync the rename", target, errno);
  if (::fsync(dfd.get()) != 0) fail("fsync of its directory", target, errno);
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
