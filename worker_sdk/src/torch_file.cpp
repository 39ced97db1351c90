// torch.save's file format, both ways (see serialize.hpp): the zip container is LibTorch's
// (caffe2::serialize), the pickle inside is read here. Python's torch.save writes pickle protocol 2
// (or the one asked for) with a handful of PyTorch callables in it; this reader knows the opcodes of
// protocols 2 to 5 that describe data and the callables of PyTorch's weights-only allowlist that
// state dicts need, and refuses anything else by name. Every read is bounded by the data, every
// stack and memo access checked, every tensor view checked against its storage: a hostile file
// gets an error, not a crash.
#include "ddprun/worker/serialize.hpp"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace ddprun::worker {
namespace {

constexpr int kMaxDepth = 1000;  // containers within containers: deeper is refused, not recursed into

// The callables and classes a torch.save file may name.
enum class Global {
  kOrderedDict,       // collections.OrderedDict: a dict
  kRebuildTensor,     // torch._utils._rebuild_tensor_v2: a tensor viewing a storage
  kRebuildParameter,  // torch._utils._rebuild_parameter(_with_state): nn.Parameter's data
  kPassThrough,       // torch.jit._pickle.restore_type_tag and build_*list (TorchScript's tags), torch.Size
  kStorageType,       // torch.FloatStorage and the like: the element type of a persistent storage
};

struct Item {
  enum class Kind { kValue, kGlobal, kStorage, kTuple };
  Kind kind = Kind::kValue;
  c10::IValue value;         // kValue; kStorage: the whole storage as a 1-D tensor
  Global global{};           // kGlobal
  at::ScalarType dtype{};    // kGlobal (kStorageType)
  std::vector<Item> parts;   // kTuple: a tuple holding a global or a storage (arguments, persistent ids)
};

// A name read from the file, fit for an error message: bytes outside printable ASCII as \xNN.
std::string printable(const std::string& s) {
  std::string out;
  for (const unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return s.size() > 200 ? out + "..." : out;
}

const std::map<std::string, at::ScalarType>& storage_types() {
  static const std::map<std::string, at::ScalarType> types{
      {"FloatStorage", at::kFloat},       {"DoubleStorage", at::kDouble},  {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16}, {"LongStorage", at::kLong},      {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort},       {"CharStorage", at::kChar},      {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool},         {"ComplexFloatStorage", at::kComplexFloat},
      {"ComplexDoubleStorage", at::kComplexDouble}, {"UntypedStorage", at::kByte}};
  return types;
}

using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

class Unpickler {
 public:
  Unpickler(const char* data, size_t size, StorageLoader load_storage, std::string what)
      : data_(data), size_(size), load_storage_(std::move(load_storage)), what_(std::move(what)) {}

  c10::IValue run() {
    for (;;) {
      const size_t at = pos_;
      const uint8_t op = u8();
      if (op == '.') break;  // STOP
      step(op, at);
    }
    if (stack_.size() != 1) fail("the pickle ends with " + std::to_string(stack_.size()) + " values on its stack, not 1");
    return value_of(stack_.back(), "the file's value");
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(what_ + ": " + why + " (byte " + std::to_string(op_at_) + " of its pickle)");
  }

  void need(size_t n) const {
    if (n > size_ - pos_) fail("the pickle is truncated");
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint64_t le(size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  std::string bytes(uint64_t n) {
    if (n > size_ - pos_) fail("a string runs past the end of the pickle");
    std::string s(data_ + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  std::string line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    if (!nl) fail("a GLOBAL name has no end of line");
    const size_t n = static_cast<size_t>(static_cast<const char*>(nl) - (data_ + pos_));
    std::string s(data_ + pos_, n);
    pos_ += n + 1;
    return s;
  }

  Item pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("the pickle pops an empty stack");
    Item it = std::move(stack_.back());
    stack_.pop_back();
    return it;
  }
  Item& top() {
    if (stack_.empty()) fail("the pickle reads an empty stack");
    return stack_.back();
  }
  std::vector<Item> pop_mark() {
    if (marks_.empty()) fail("the pickle closes a MARK it never opened");
    const size_t from = marks_.back();
    marks_.pop_back();
    std::vector<Item> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(from)),
                            std::make_move_iterator(stack_.end()));
    stack_.resize(from);
    return items;
  }
  void push(c10::IValue v) {
    Item it;
    it.value = std::move(v);
    stack_.push_back(std::move(it));
  }

  // The value an item stands for, where only data may go (a container, the file's result).
  c10::IValue value_of(const Item& it, const char* where) const {
    switch (it.kind) {
      case Item::Kind::kValue:
        return it.value;
      case Item::Kind::kGlobal:
        fail(std::string("a class or function stands where data must (") + where + ")");
      case Item::Kind::kStorage:
        fail(std::string("a bare storage stands where data must (") + where + ")");
      case Item::Kind::kTuple:
        fail(std::string("a tuple of classes or storages stands where data must (") + where + ")");
    }
    fail("unknown item");
  }

  int depth_of(const c10::IValue& v) const {
    if (!v.isList() && !v.isGenericDict() && !v.isTuple()) return 0;
    auto it = depth_.find(v.internalToPointer());
    return it == depth_.end() ? 1 : it->second;
  }
  void contains(const c10::IValue& container, const c10::IValue& element) {
    const int d = depth_of(element) + 1;
    int& mine = depth_[container.internalToPointer()];
    mine = std::max({mine, 1, d});
    if (mine > kMaxDepth) fail("containers are nested more than " + std::to_string(kMaxDepth) + " deep");
  }

  Item make_tuple(std::vector<Item> items) {
    Item out;
    bool plain = true;
    for (const auto& i : items) plain = plain && i.kind == Item::Kind::kValue;
    if (!plain) {
      out.kind = Item::Kind::kTuple;
      out.parts = std::move(items);
      return out;
    }
    std::vector<c10::IValue> elements;
    elements.reserve(items.size());
    for (auto& i : items) elements.push_back(std::move(i.value));
    out.value = c10::ivalue::Tuple::create(std::move(elements));
    for (const auto& e : out.value.toTupleRef().elements()) contains(out.value, e);
    return out;
  }

  static std::vector<Item> tuple_parts(const Item& t) {
    if (t.kind == Item::Kind::kTuple) return t.parts;
    std::vector<Item> parts;
    if (t.kind == Item::Kind::kValue && t.value.isTuple()) {
      for (const auto& e : t.value.toTupleRef().elements()) {
        Item i;
        i.value = e;
        parts.push_back(std::move(i));
      }
    }
    return parts;
  }

  void set_item(const c10::IValue& dict, Item key, Item value) {
    if (!dict.isGenericDict()) fail("SETITEM on something that is not a dict");
    const c10::IValue k = value_of(key, "a dict key"), v = value_of(value, "a dict value");
    if (!k.isString() && !k.isInt() && !k.isBool() && !k.isDouble()) {
      fail("a dict key is a " + k.tagKind() + " (ddprun reads str, int, float and bool keys)");
    }
    contains(dict, v);
    dict.toGenericDict().insert_or_assign(k, v);
  }
  void append(const c10::IValue& list, const Item& value) {
    if (!list.isList()) fail("APPEND on something that is not a list");
    const c10::IValue v = value_of(value, "a list element");
    contains(list, v);
    list.toList().push_back(v);
  }

  Item resolve_global(const std::string& module, const std::string& name) {
    Item g;
    g.kind = Item::Kind::kGlobal;
    const std::string full = module + "." + name;
    if (full == "collections.OrderedDict") {
      g.global = Global::kOrderedDict;
    } else if (full == "torch._utils._rebuild_tensor_v2") {
      g.global = Global::kRebuildTensor;
    } else if (full == "torch._utils._rebuild_parameter" || full == "torch._utils._rebuild_parameter_with_state") {
      g.global = Global::kRebuildParameter;
    } else if (full == "torch.jit._pickle.restore_type_tag" || full == "torch.jit._pickle.build_intlist" ||
               full == "torch.jit._pickle.build_doublelist" || full == "torch.jit._pickle.build_boollist" ||
               full == "torch.jit._pickle.build_tensorlist" || full == "torch.Size") {
      g.global = Global::kPassThrough;
    } else if (module == "torch" && storage_types().count(name)) {
      g.global = Global::kStorageType;
      g.dtype = storage_types().at(name);
    } else {
      fail("the file holds a Python object of " + printable(full) +
           ", which ddprun does not load: it reads what torch.load(weights_only=True) reads (tensors, state "
           "dicts, dicts, lists and tuples of numbers, strings and None); save plain state dicts");
    }
    return g;
  }

  static int64_t int_of(const Item& i, bool& ok) {
    ok = i.kind == Item::Kind::kValue && i.value.isInt();
    return ok ? i.value.toInt() : 0;
  }
  std::vector<int64_t> ints_of(const Item& t, const char* what) {
    if (t.kind != Item::Kind::kValue || !t.value.isTuple()) fail(std::string("a tensor's ") + what + " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& e : t.value.toTupleRef().elements()) {
      if (!e.isInt() || e.toInt() < 0) fail(std::string("a tensor's ") + what + " holds something not a count");
      out.push_back(e.toInt());
    }
    return out;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  c10::IValue rebuild_tensor(const std::vector<Item>& a) {
    if (a.size() < 4 || a[0].kind != Item::Kind::kStorage) fail("_rebuild_tensor_v2 without a storage");
    bool ok = false;
    const int64_t offset = int_of(a[1], ok);
    if (!ok || offset < 0) fail("a tensor's storage offset is not a count");
    const auto sizes = ints_of(a[2], "size"), strides = ints_of(a[3], "stride");
    if (sizes.size() != strides.size()) fail("a tensor has " + std::to_string(sizes.size()) + " sizes but " +
                                             std::to_string(strides.size()) + " strides");
    const at::Tensor& base = a[0].value.toTensor();
    int64_t last = offset;  // the last element the view reads
    bool empty = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t span = 0;
      if (sizes[d] == 0) empty = true;
      if (sizes[d] > 0 && (__builtin_mul_overflow(sizes[d] - 1, strides[d], &span) ||
                           __builtin_add_overflow(last, span, &last))) {
        fail("a tensor's size and stride overflow");
      }
    }
    if (!empty && last >= base.numel()) {
      fail("a tensor reads element " + std::to_string(last) + " of a storage of " + std::to_string(base.numel()));
    }
    return at::empty({0}, base.options()).set_(base.storage(), offset, sizes, strides);
  }

  Item call(const Item& fn, const Item& args) {
    if (fn.kind != Item::Kind::kGlobal) fail("REDUCE calls something that is not a class or function");
    const std::vector<Item> a = tuple_parts(args);
    Item out;
    switch (fn.global) {
      case Global::kOrderedDict:
        if (!a.empty()) fail("OrderedDict is built from arguments (ddprun reads the form torch.save writes)");
        out.value = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
        return out;
      case Global::kRebuildTensor:
        out.value = rebuild_tensor(a);
        return out;
      case Global::kRebuildParameter:
      case Global::kPassThrough:
        if (a.empty()) fail("a PyTorch helper is called without arguments");
        if (fn.global == Global::kRebuildParameter && !(a[0].kind == Item::Kind::kValue && a[0].value.isTensor())) {
          fail("_rebuild_parameter of something that is not a tensor");
        }
        out.value = value_of(a[0], "an argument");
        return out;
      case Global::kStorageType:
        fail("a storage class is called (ddprun reads storages as torch.save writes them: by persistent id)");
    }
    fail("unknown callable");
  }

  // ('storage', storage_type, key, location, numel)
  Item persistent(const Item& pid) {
    const std::vector<Item> p = tuple_parts(pid);
    if (p.size() != 5 || !(p[0].kind == Item::Kind::kValue && p[0].value.isString() &&
                           p[0].value.toStringRef() == "storage")) {
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    }
    if (p[1].kind != Item::Kind::kGlobal || p[1].global != Global::kStorageType) fail("a storage of no storage type");
    if (!(p[2].kind == Item::Kind::kValue && p[2].value.isString())) fail("a storage key that is not a string");
    bool ok = false;
    const int64_t numel = int_of(p[4], ok);
    if (!ok || numel < 0) fail("a storage's size is not a count");
    const std::string& key = p[2].value.toStringRef();
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      it = storages_.emplace(key, load_storage_(key, p[1].dtype, numel)).first;
    } else if (it->second.scalar_type() != p[1].dtype || it->second.numel() != numel) {
      fail("storage " + printable(key) + " is named twice with different types or sizes");
    }
    Item s;
    s.kind = Item::Kind::kStorage;
    s.value = it->second;
    return s;
  }

  void step(uint8_t op, size_t at) {
    op_at_ = at;
    switch (op) {
      case 0x80: u8(); return;                               // PROTO
      case 0x95: le(8); return;                              // FRAME
      case '(': marks_.push_back(stack_.size()); return;     // MARK
      case '0': pop(); return;                               // POP
      case '1': pop_mark(); return;                          // POP_MARK
      case '2': { Item copy = top(); stack_.push_back(std::move(copy)); return; }  // DUP
      case 'N': push(c10::IValue()); return;                 // NONE
      case 0x88: push(true); return;                         // NEWTRUE
      case 0x89: push(false); return;                        // NEWFALSE
      case 'J': push(static_cast<int64_t>(static_cast<int32_t>(le(4)))); return;  // BININT
      case 'K': push(static_cast<int64_t>(le(1))); return;  // BININT1
      case 'M': push(static_cast<int64_t>(le(2))); return;  // BININT2
      case 0x8a:                                             // LONG1
      case 0x8b: {                                           // LONG4
        const uint64_t n = op == 0x8a ? le(1) : le(4);
        if (n > 8) fail("an integer of " + std::to_string(n) + " bytes (ddprun reads 64-bit integers)");
        uint64_t v = n ? le(static_cast<size_t>(n)) : 0;
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        push(static_cast<int64_t>(v));
        return;
      }
      case 'G': {  // BINFLOAT: big-endian
        need(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(data_[pos_ + i]);
        pos_ += 8;
        double d;
        std::memcpy(&d, &bits, sizeof d);
        push(d);
        return;
      }
      case 0x8c: case 'U': push(bytes(le(1))); return;  // SHORT_BINUNICODE, SHORT_BINSTRING
      case 'X': case 'T': push(bytes(le(4))); return;   // BINUNICODE, BINSTRING
      case 0x8d: push(bytes(le(8))); return;            // BINUNICODE8
      case ')': stack_.push_back(make_tuple({})); return;  // EMPTY_TUPLE
      case 't': stack_.push_back(make_tuple(pop_mark())); return;  // TUPLE
      case 0x85: case 0x86: case 0x87: {                 // TUPLE1..3
        std::vector<Item> items(static_cast<size_t>(op - 0x84));
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        stack_.push_back(make_tuple(std::move(items)));
        return;
      }
      case ']': push(c10::impl::GenericList(c10::AnyType::get())); return;  // EMPTY_LIST
      case 'l': {                                                            // LIST
        auto items = pop_mark();
        push(c10::impl::GenericList(c10::AnyType::get()));
        for (auto& i : items) append(top().value, i);
        return;
      }
      case 'a': { Item v = pop(); append(top().value, v); return; }   // APPEND
      case 'e': {                                                      // APPENDS
        auto items = pop_mark();
        for (auto& i : items) append(top().value, i);
        return;
      }
      case '}': push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())); return;  // EMPTY_DICT
      case 'd': case 'u': {  // DICT, SETITEMS
        auto items = pop_mark();
        if (items.size() % 2) fail("a dict of an odd number of keys and values");
        if (op == 'd') push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
        const c10::IValue dict = top().value;
        for (size_t i = 0; i < items.size(); i += 2) set_item(dict, std::move(items[i]), std::move(items[i + 1]));
        return;
      }
      case 's': {  // SETITEM
        Item v = pop(), k = pop();
        set_item(top().value, std::move(k), std::move(v));
        return;
      }
      case 'c': {  // GLOBAL
        const std::string module = line();
        stack_.push_back(resolve_global(module, line()));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        const Item name = pop(), module = pop();
        const c10::IValue n = value_of(name, "a global's name"), m = value_of(module, "a global's module");
        if (!n.isString() || !m.isString()) fail("STACK_GLOBAL of something not a string");
        stack_.push_back(resolve_global(m.toStringRef(), n.toStringRef()));
        return;
      }
      case 'R': {  // REDUCE
        const Item args = pop(), fn = pop();
        stack_.push_back(call(fn, args));
        return;
      }
      case 'b': {  // BUILD: only an OrderedDict's instance state; a state dict's _metadata is kept as a key
        const Item state = pop();
        const Item& obj = top();
        if (!(obj.kind == Item::Kind::kValue && obj.value.isGenericDict())) fail("BUILD of something not a dict");
        if (state.kind == Item::Kind::kValue && state.value.isGenericDict()) {
          auto meta = state.value.toGenericDict().find("_metadata");
          if (meta != state.value.toGenericDict().end() && meta->value().isGenericDict()) {
            contains(obj.value, meta->value());
            obj.value.toGenericDict().insert_or_assign("_metadata", meta->value());
          }
        }
        return;
      }
      case 'Q': { const Item pid = pop(); stack_.push_back(persistent(pid)); return; }  // BINPERSID
      case 'q': memo_[static_cast<uint32_t>(le(1))] = top(); return;                   // BINPUT
      case 'r': memo_[static_cast<uint32_t>(le(4))] = top(); return;                   // LONG_BINPUT
      case 0x94: memo_[static_cast<uint32_t>(memo_.size())] = top(); return;           // MEMOIZE
      case 'h': case 'j': {                                                            // BINGET, LONG_BINGET
        const auto id = static_cast<uint32_t>(op == 'h' ? le(1) : le(4));
        auto it = memo_.find(id);
        if (it == memo_.end()) fail("the pickle reads memo " + std::to_string(id) + ", never stored");
        stack_.push_back(it->second);
        return;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("pickle opcode ") + hex + " is not one torch.save writes for data");
      }
    }
  }

  const char* data_;
  size_t size_;
  size_t pos_ = 0, op_at_ = 0;
  StorageLoader load_storage_;
  std::string what_;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, Item> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;
  std::unordered_map<const void*, int> depth_;
};

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
  void raw(const void* p, size_t n) { out_.insert(out_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n); }
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
                                  (t.is_quantized() ? " (quantized)" : t.is_sparse() ? " (sparse)" : ""));
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
  StorageLoader load = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    const std::string name = "data/" + key;
    if (key.empty() || key.find('/') != std::string::npos || !reader->hasRecord(name)) {
      throw std::runtime_error(what + ": its pickle names storage '" + printable(key) + "', which the file does not hold");
    }
    auto [ptr, n] = record(name);
    const size_t item = c10::elementSize(dtype);
    if (static_cast<uint64_t>(numel) > n / item) {
      throw std::runtime_error(what + ": storage " + printable(key) + " holds " + std::to_string(n) + " bytes, not the " +
                               std::to_string(numel) + " elements of " + std::to_string(item) + " bytes it claims");
    }
    auto holder = std::make_shared<at::DataPtr>(std::move(ptr));
    at::Tensor t = at::from_blob(holder->get(), {numel}, [holder](void*) {}, at::TensorOptions().dtype(dtype));
    if (map_location && !map_location->is_cpu()) t = t.to(*map_location);
    return t;
  };
  return Unpickler(static_cast<const char*>(pickle.get()), pickle_size, load, what).run();
}

c10::IValue torch_load(const std::string& path, std::optional<c10::Device> map_location) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  return torch_load_bytes(bytes, path, map_location);
}

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  Pickler pickler;
  pickler.run(value);
  std::vector<char> file;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* buf, size_t n) {
    file.insert(file.end(), static_cast<const char*>(buf), static_cast<const char*>(buf) + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickler.bytes().data(), pickler.bytes().size());
  writer.writeRecord("byteorder", "little", 6);
  for (const auto& [key, t] : pickler.storages()) {
    writer.writeRecord("data/" + key, t.storage().data_ptr().get(), t.storage().nbytes());
  }
  writer.writeEndOfFile();
  return file;
}

}  // namespace ddprun::worker
