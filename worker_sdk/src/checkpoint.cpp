#include "ddprun/worker/checkpoint.hpp"

#include <ATen/core/Dict.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "ddprun/worker/progress.hpp"

namespace ddprun::worker {
namespace {

std::string strip_module_prefix(const std::string& name) {
  return name.rfind("module.", 0) == 0 ? name.substr(7) : name;
}

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
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) fail("creating a temporary file in " + dir.string(), target, errno);
  auto abandon = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    fail(what, target, err);
  };
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      abandon("writing " + tmp, err);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    abandon("fsync of " + tmp, err);
  }
  if (::close(fd) != 0) abandon("closing " + tmp, errno);
  // Last moment before publishing: a node whose ddprun has not renewed its place in the job (frozen,
  // stopped, cut off) may have been replaced by a group re-formed without it, whose checkpoints
  // this one must not overwrite.
  if (const auto lapsed = membership_lapsed()) {
    ::unlink(tmp.c_str());
    throw std::runtime_error("not publishing checkpoint " + target.string() + ": this node's place in the job lapsed " +
                             std::to_string(lapsed->count()) + " ms ago (its ddprun was frozen, stopped or cut off "
                             "from the rendezvous), so the other nodes may have gone on without it; the previous "
                             "checkpoint is kept");
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) abandon("renaming " + tmp + " over it", errno);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail("opening its directory to fsync the rename", target, errno);
  const int synced = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (synced != 0) fail("fsync of its directory", target, err);
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
    write_durably(path, torch::pickle_save(root));
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
    // map_location: the optimizer state goes to this rank's own device (the model's), not to the
    // device it was saved from (which may not exist here, or be another rank's GPU).
    c10::optional<torch::Device> device;
    for (const auto& p : model.parameters()) {
      device = p.device();
      break;
    }
    archive.load_from(static_cast<const char*>(raw.data_ptr()), static_cast<size_t>(raw.numel()), device);
    optimizer->load(archive);
  }
  return root.contains("epoch") ? std::optional<int64_t>(root.at("epoch").toInt()) : std::optional<int64_t>(0);
}

}  // namespace ddprun::worker
