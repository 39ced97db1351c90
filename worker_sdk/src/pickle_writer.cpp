// ddprun's pickle writer (pickle.hpp): what Python's torch.save writes, readable weights-only.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "pickle.hpp"

namespace ddprun::worker::pickle {
namespace {

// Writes pickle protocol 2 as Python's torch.save does: dicts, lists, tuples, strings, numbers,
// None, and tensors as _rebuild_tensor_v2 of persistent storages (one record each, shared by the
// tensors that share it). A dict holding "_metadata" (a state dict's, state_dict() puts it there)
// is written as Python's state dicts are, an OrderedDict with _metadata as its instance state, so
// that Python's load_state_dict sees the versions of the modules' layouts.
class Pickler {
 public:
  void run(const c10::IValue& v) {
    out_.push_back('\x80');
    out_.push_back('\x02');
    value(v, 0);
    out_.push_back('.');
  }
  const std::vector<char>& bytes() const { return out_; }
  const std::vector<std::pair<std::string, at::Tensor>>& storages() const { return storages_; }

 private:
  void op(char c) { out_.push_back(c); }
  void raw(const void* p, size_t n) {
    out_.insert(out_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  }
  void le(uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void global(const char* module, const char* name) {
    op('c');
    raw(module, std::strlen(module));
    op('\n');
    raw(name, std::strlen(name));
    op('\n');
  }
  void str(const std::string& s) {
    op('X');
    le(s.size(), 4);
    raw(s.data(), s.size());
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      le(static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      op('M');
      le(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      op('\x8a');
      le(8, 1);
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void dict_items(const c10::impl::GenericDict& d, int depth) {
    op('}');
    if (d.size() == 0) return;
    op('(');
    for (const auto& kv : d) {
      if (kv.key().isString() && kv.key().toStringRef() == "_metadata" && kv.value().isGenericDict()) continue;
      value(kv.key(), depth + 1);
      value(kv.value(), depth + 1);
    }
    op('u');
  }
  void value(const c10::IValue& v, int depth) {
    if (depth > kMaxDepth) throw std::invalid_argument("torch_save: containers nested more than 1000 deep");
    if (v.isNone()) {
      op('N');
    } else if (v.isBool()) {
      op(v.toBool() ? '\x88' : '\x89');
    } else if (v.isInt()) {
      integer(v.toInt());
    } else if (v.isDouble()) {
      uint64_t bits;
      const double d = v.toDouble();
      std::memcpy(&bits, &d, sizeof bits);
      op('G');
      for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    } else if (v.isString()) {
      str(v.toStringRef());
    } else if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isTuple()) {
      const auto& elements = v.toTupleRef().elements();
      if (elements.empty()) {
        op(')');
        return;
      }
      op('(');
      for (const auto& e : elements) value(e, depth + 1);
      op('t');
    } else if (v.isList()) {
      op(']');
      const auto list = v.toListRef();
      if (list.empty()) return;
      op('(');
      for (const auto& e : list) value(e, depth + 1);
      op('e');
    } else if (v.isGenericDict()) {
      const auto d = v.toGenericDict();
      auto meta = d.find("_metadata");
      if (meta == d.end() || !meta->value().isGenericDict()) {
        dict_items(d, depth);
        return;
      }
      global("collections", "OrderedDict");
      op(')');
      op('R');
      op('(');
      for (const auto& kv : d) {
        if (kv.key().isString() && kv.key().toStringRef() == "_metadata") continue;
        value(kv.key(), depth + 1);
        value(kv.value(), depth + 1);
      }
      op('u');
      op('}');
      op('(');
      str("_metadata");
      value(meta->value(), depth + 1);
      op('u');
      op('b');
    } else {
      throw std::invalid_argument("torch_save: a " + v.tagKind() +
                                  " is not data torch.load reads (save tensors, dicts, lists, tuples, strings, "
                                  "numbers, bools and None)");
    }
  }
  void tensor(at::Tensor t) {
    t = t.detach();
    if (!t.device().is_cpu()) t = t.cpu();  // as torch.save writes it, but loads onto the CPU
    const char* type = nullptr;
    for (const auto& [name, dtype] : storage_types()) {
      if (dtype == t.scalar_type() && name != "UntypedStorage") type = name.c_str();
    }
    if (!type || t.is_quantized() || t.is_sparse() || !t.has_storage()) {
      throw std::invalid_argument(std::string("torch_save: cannot save a tensor of ") + c10::toString(t.scalar_type()) +
                                  (t.is_quantized() ? " (quantized)"
                                   : t.is_sparse()  ? " (sparse)"
                                                    : ""));
    }
    const void* id = t.storage().unsafeGetStorageImpl();
    auto it = keys_.find(id);
    if (it == keys_.end()) {
      it = keys_.emplace(id, std::to_string(keys_.size())).first;
      storages_.emplace_back(it->second, t);
    }
    const int64_t numel = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    op('(');
    str("storage");
    global("torch", type);
    str(it->second);
    str("cpu");
    integer(numel);
    op('t');
    op('Q');
    integer(t.storage_offset());
    op('(');
    for (int64_t s : t.sizes()) integer(s);
    op('t');
    op('(');
    for (int64_t s : t.strides()) integer(s);
    op('t');
    op('\x89');  // requires_grad
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }

  std::vector<char> out_;
  std::unordered_map<const void*, std::string> keys_;
  std::vector<std::pair<std::string, at::Tensor>> storages_;
};

}  // namespace

Written write(const c10::IValue& value) {
  Pickler pickler;
  pickler.run(value);
  return {pickler.bytes(), pickler.storages()};
}

}  // namespace ddprun::worker::pickle
