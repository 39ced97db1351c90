// torch.save's file format, both ways (see serialize.hpp): the zip container is LibTorch's
// (caffe2::serialize), the pickle inside it ddprun's (pickle.hpp).
#include "ddprun/worker/serialize.hpp"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "pickle.hpp"

namespace ddprun::worker {
namespace {

class BytesAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesAdapter(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* what = "") const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - static_cast<size_t>(pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& bytes_;
};

}  // namespace

c10::IValue torch_load_bytes(const std::vector<char>& bytes, const std::string& what,
                             std::optional<c10::Device> map_location) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(std::make_shared<BytesAdapter>(bytes));
  } catch (const std::exception& e) {
    throw std::runtime_error(what + " is not a torch.save file (a zip archive): " +
                             std::string(e.what()).substr(0, std::string(e.what()).find('\n')) +
                             ". Files of torch.save(..., _use_new_zipfile_serialization=False) are not read: "
                             "save them again with torch.save(obj, path)");
  }
  auto record = [&](const std::string& name) {
    try {
      return reader->getRecord(name);
    } catch (const std::exception& e) {
      throw std::runtime_error(what + ": cannot read its record " + name + ": " +
                               std::string(e.what()).substr(0, std::string(e.what()).find('\n')));
    }
  };
  if (reader->hasRecord("byteorder")) {
    auto [ptr, n] = record("byteorder");
    if (std::string(static_cast<const char*>(ptr.get()), n) != "little") {
      throw std::runtime_error(what + " was written on a big-endian machine, which ddprun does not read");
    }
  }
  if (!reader->hasRecord("data.pkl")) throw std::runtime_error(what + " has no data.pkl: it is not a torch.save file");
  auto [pickle, pickle_size] = record("data.pkl");
  pickle::StorageLoader load = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    const std::string name = "data/" + key;
    if (key.empty() || key.find('/') != std::string::npos || !reader->hasRecord(name)) {
      throw std::runtime_error(what + ": its pickle names storage '" + pickle::printable(key) +
                               "', which the file does not hold");
    }
    auto [ptr, n] = record(name);
    const size_t item = c10::elementSize(dtype);
    if (static_cast<uint64_t>(numel) > n / item) {
      throw std::runtime_error(what + ": storage " + pickle::printable(key) + " holds " + std::to_string(n) +
                               " bytes, not the " + std::to_string(numel) + " elements of " + std::to_string(item) +
                               " bytes it claims");
    }
    auto holder = std::make_shared<at::DataPtr>(std::move(ptr));
    at::Tensor t = at::from_blob(
        holder->get(), {numel}, [holder](void*) {}, at::TensorOptions().dtype(dtype));
    if (map_location && !map_location->is_cpu()) t = t.to(*map_location);
    return t;
  };
  return pickle::read(static_cast<const char*>(pickle.get()), pickle_size, load, what);
}

c10::IValue torch_load(const std::string& path, std::optional<c10::Device> map_location) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  return torch_load_bytes(bytes, path, map_location);
}

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  const pickle::Written pickled = pickle::write(value);
  std::vector<char> file;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* buf, size_t n) {
    file.insert(file.end(), static_cast<const char*>(buf), static_cast<const char*>(buf) + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickled.bytes.data(), pickled.bytes.size());
  writer.writeRecord("byteorder", "little", 6);
  for (const auto& [key, t] : pickled.storages) {
    writer.writeRecord("data/" + key, t.storage().data_ptr().get(), t.storage().nbytes());
  }
  writer.writeEndOfFile();
  return file;
}

}  // namespace ddprun::worker
