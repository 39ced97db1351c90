#pragma once
// The pickle inside torch.save's files, ddprun's own reader and writer (torch_file.cpp has the zip
// container around them; serialize.hpp says why LibTorch's are not used).
//
// The reader knows the opcodes of pickle protocols 2 to 5 that describe data and the callables of
// PyTorch's weights-only allowlist that state dicts need, and refuses anything else by name. Every
// read is bounded by the data, every stack and memo access checked, every tensor view checked
// against its storage: a hostile file gets an error, not a crash. The writer writes protocol 2 as
// Python's torch.save does.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::worker::pickle {

inline constexpr int kMaxDepth = 1000;  // containers within containers: deeper is refused, not recursed into

// torch.FloatStorage and the like, by name, and the element type each stands for.
const std::map<std::string, at::ScalarType>& storage_types();

// A name read from a file, fit for an error message: bytes outside printable ASCII as \xNN.
std::string printable(const std::string& s);

// The storage a persistent id names: its record "data/KEY" as a 1-D tensor of `numel` elements.
using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

// The value of a pickle (data.pkl); `what` names it in errors (std::runtime_error).
c10::IValue read(const char* data, size_t size, StorageLoader load_storage, const std::string& what);

// A pickle of `value` and the storages its tensors view, each to be written as record "data/KEY".
struct Written {
  std::vector<char> bytes;
  std::vector<std::pair<std::string, at::Tensor>> storages;
};
Written write(const c10::IValue& value);

}  // namespace ddprun::worker::pickle
